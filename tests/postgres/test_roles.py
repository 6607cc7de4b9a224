"""Least privilege with real roles (issue 38): plain roles made by the test (no superuser,
no CREATEDB, no CREATEROLE) in a schema an administrator made for the ledger's owner, as on
RDS, Cloud SQL or Supabase.

- The schema's owner, without CREATE on the database, creates and upgrades the ledger.
- ``python -m cronlock grants`` applied as printed: the replica, the operator and the
  reader each do their work with exactly those grants.
- One grant fewer: the entry point that needs it fails with one line that names the
  privilege (exit status 3 on the command line; a replica's start refused).
- The command line's exit statuses and no traceback for an expected error.

Every role and the schema are dropped at the end, also when a test fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from starlette.requests import Request

import cronlock.web
from cronlock import LockerMisconfigured, Scheduler
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

from ..eventually import eventually
from ..test_cli import main_here
from ..throwaway import prefix

pytestmark = pytest.mark.postgres

TABLE = "cronlock_runs"
PARTS = ("owner", "replica", "operator", "reader")


@dataclass(frozen=True)
class Roles:
    """The server, the schema its owner was given, and the four roles' names."""

    server: str
    schema: str
    names: dict[str, str]

    def dsn(self, part: str) -> str:
        """The server's DSN, connecting as *part*'s role (trust, or the same password)."""
        parts = urlsplit(self.server)
        netloc = f"{self.names[part]}@{parts.hostname}:{parts.port or 5432}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    @property
    def ledger(self) -> LedgerTable:
        return LedgerTable(TABLE, self.schema)


async def _admin(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m cronlock ARGS`` in a process of its own: the exit status a shell sees."""
    return subprocess.run(
        [sys.executable, "-m", "cronlock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _here(*args: str) -> subprocess.CompletedProcess[str]:
    """What :func:`_cli` answers, from the command line's ``main()`` in this process (on a
    thread of its own: the verbs run an event loop of their own). Like ``_cli``, it blocks
    the caller until done."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(main_here, args).result()


def _cli_as(roles: Roles, part: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A ledger verb run as *part*, on the roles' ledger (in this process: :func:`_here`)."""
    verb, *rest = args
    if verb == "schedules":
        action, *rest = rest
        verb = f"schedules {action}"
    return _here(*verb.split(), "--dsn", roles.dsn(part), "--schema", roles.schema, *rest)


@pytest.fixture(scope="module")
def roles(pg_server: str) -> Iterator[Roles]:
    """Four plain roles and a schema owned by the first, made as an administrator would
    (``CREATE SCHEMA ... AUTHORIZATION``); the ledger created by the owner with ``migrate``
    and the grants applied as ``grants`` prints them. All dropped afterwards."""
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
    names = {part: f"cl_{part}_{tag}" for part in PARTS}
    schema = f"{prefix()}{tag}_roles"
    made = Roles(pg_server, schema, names)
    plain = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT"
    try:
        asyncio.run(
            _admin(
                pg_server,
                *(f"CREATE ROLE {quote_ident(name)} {plain}" for name in names.values()),
                f"CREATE SCHEMA {quote_ident(schema)} AUTHORIZATION {quote_ident(names['owner'])}",
            )
        )
        created = _cli_as(made, "owner", "migrate")
        assert created.returncode == 0, created.stderr
        printed = _grants(made)
        asyncio.run(_as(made, "owner", printed))
        # Jobs the ledger knows (the verbs refuse one it does not, unless forced).
        known = f"""INSERT INTO "{schema}"."{TABLE}" (job, slot, host, pid, finished_at, outcome)
                    SELECT job, now(), 'h', 1, now(), 'succeeded'
                    FROM unnest(ARRAY['j', 'ops-job']) AS job"""
        asyncio.run(_as(made, "owner", known))
        yield made
    finally:
        quoted = ", ".join(quote_ident(name) for name in names.values())
        asyncio.run(
            _admin(
                pg_server,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE usename IN ({', '.join(repr(n) for n in names.values())})",
                f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE",
                f"DROP ROLE IF EXISTS {quoted}",
            )
        )


def _grants(roles: Roles, *extra: str) -> str:
    printed = _here(
        "grants",
        "--schema", roles.schema,
        *("--replica", roles.names["replica"]),
        *("--operator", roles.names["operator"]),
        *("--reader", roles.names["reader"]),
        "--mode", "lease",
        *extra,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    return printed.stdout


async def _as(roles: Roles, part: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(roles.dsn(part))
    try:
        return await conn.execute(sql, *args)
    finally:
        await conn.close()


async def _fetch(roles: Roles, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(roles.server)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


# -- the schema's owner ------------------------------------------------------------------


async def test_the_schema_owner_without_database_create_creates_and_upgrades_a_ledger(
    roles: Roles,
) -> None:
    [[may_create]] = await _fetch(
        roles, "SELECT has_database_privilege($1, current_database(), 'CREATE')",
        roles.names["owner"],
    )  # fmt: skip
    assert may_create is False
    table = "owned_runs"
    made = _cli_as(roles, "owner", "migrate", "--table", table)
    assert made.returncode == 0, made.stderr
    assert made.stdout.endswith(": created\n"), made.stdout
    # A ledger of an older cronlock (a column it lacks): the owner upgrades it.
    await _as(roles, "owner", f'ALTER TABLE "{roles.schema}"."{table}" DROP COLUMN retry_at')
    upgraded = _cli_as(roles, "owner", "migrate", "--table", table)
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.endswith(": upgraded\n"), upgraded.stdout
    # A replica of the owner creates a ledger of its own too, and runs its job.
    ran = await _run_replica(roles, "owner", table="replica_made", create=True)
    assert ran >= 1


async def test_without_the_right_to_create_the_refusal_names_the_privilege(roles: Roles) -> None:
    # A schema that is missing: creating it needs CREATE on the database.
    missing = f"{roles.schema}_x"
    refused = _here("migrate", "--dsn", roles.dsn("owner"), "--schema", missing)
    assert refused.returncode == 3, refused.stderr
    assert "lacks CREATE on the database" in refused.stderr, refused.stderr
    # Tables in a schema one may only use: CREATE on the schema.
    other = _cli_as(roles, "reader", "migrate", "--table", "reader_runs")
    assert other.returncode == 3 and "lacks CREATE on schema" in other.stderr, other.stderr
    # Upgrading tables one does not own: their owner.
    await _as(roles, "owner", f'ALTER TABLE "{roles.schema}"."{TABLE}_jobs" DROP COLUMN tags')
    try:
        upgrade = _cli_as(roles, "operator", "migrate")
        assert upgrade.returncode == 3 and "only the owner" in upgrade.stderr, upgrade.stderr
        # A replica that may not upgrade it is refused at its start, with the same words
        # (not "cannot connect", retried).
        with pytest.raises(LockerMisconfigured, match="only the owner of its tables"):
            await _run_replica(roles, "replica", mode="session", create=True)
    finally:
        assert _cli_as(roles, "owner", "migrate").returncode == 0
    for result in (refused, other, upgrade):
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


# -- each role with exactly its grants ---------------------------------------------------


async def _run_replica(
    roles: Roles,
    part: str,
    *,
    table: str = TABLE,
    mode: str = "session",
    create: bool = False,
    runs: int = 1,
    also: Callable[[], Awaitable[bool]] | None = None,
) -> int:
    """Run a scheduler as *part* with one code job every 0.3 s and the task ``echo`` of the
    stored schedules until the ledger has *runs* runs of the code job (and *also* holds);
    return how many it has."""
    locker = PostgresLocker(
        roles.dsn(part), table=table, schema=roles.schema, mode=mode,  # type: ignore[arg-type]
        create_table=create, application_name=f"roles-test-{part}",
    )  # fmt: skip
    scheduler = Scheduler(locker=locker)
    job = f"code-{mode}-{uuid.uuid4().hex[:6]}"

    @scheduler.every(0.3, name=job)
    async def tick() -> None:
        pass

    @scheduler.task("echo")
    async def echo() -> None:
        pass

    async def ran() -> int:
        rows = await _fetch(
            roles, f'SELECT count(*) FROM "{roles.schema}"."{table}" WHERE job = $1', job
        )
        return int(rows[0][0])

    async def done() -> bool:
        return await ran() >= runs and (also is None or await also())

    async with scheduler:
        await eventually(done, f"{runs} run(s) of {job} as {part}")
    return await ran()


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_replica_works_with_the_replica_grants(
    roles: Roles, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    stored, odd = f"stored-{mode}", f"odd-{mode}"
    for name, task in ((stored, "echo"), (odd, "no-such-task")):
        added = _cli_as(roles, "operator", "schedules", "add", name, task, "--every", "1")
        assert added.returncode == 0, added.stderr

    async def stored_ran_and_odd_noted() -> bool:
        [[runs]] = await _fetch(
            roles, f'SELECT count(*) FROM "{roles.schema}"."{TABLE}" WHERE job = $1', stored
        )
        [[problems]] = await _fetch(
            roles, f'SELECT problems FROM "{roles.schema}"."{TABLE}_schedules" WHERE name = $1', odd
        )
        return bool(runs >= 1 and problems is not None)

    with caplog.at_level(logging.WARNING, logger="cronlock"):
        ran = await _run_replica(roles, "replica", mode=mode, runs=2, also=stored_ran_and_odd_noted)
    assert ran >= 2
    runs = await _fetch(
        roles, f'SELECT count(*) FROM "{roles.schema}"."{TABLE}" WHERE job = $1', stored
    )
    assert runs[0][0] >= 1  # the stored schedule was read and run
    [[problems]] = await _fetch(
        roles, f'SELECT problems FROM "{roles.schema}"."{TABLE}_schedules" WHERE name = $1', odd
    )
    assert problems is not None and "no-such-task" in problems  # the column grant
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_an_operator_works_with_the_operator_grants(roles: Roles) -> None:
    job = "ops-job"
    for args in (
        ("pause", job, "--force"),
        ("resume", job, "--force"),
        ("trigger", job, "--force"),
        ("retire", job, "--force"),
        ("schedules", "add", "ops:1", "echo", "--every", "60"),
        ("schedules", "update", "ops:1", "--every", "90"),
        ("schedules", "remove", "ops:1"),
        ("status",),
    ):
        done = _cli_as(roles, "operator", *args)
        assert done.returncode == 0, (args, done.stderr)
    # The operator's dashboard: it makes the CSRF key, and acts.
    app = cronlock.web.app(roles.dsn("operator"), table=TABLE, schema=roles.schema, authorize=_ops)
    async with _browser(app) as browser:
        page = await browser.get("/")
        assert page.status_code == 200, page.text
        token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        acted = await browser.post("/actions/pause", data={"job": "j", "csrf": token})
        assert acted.status_code == 303, acted.text


def _ops(request: Request) -> str:
    return "ops"


def _browser(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://dash",
        headers={"origin": "http://dash"},
    )


async def test_a_reader_works_with_the_reader_grants_and_cannot_read_the_secrets(
    roles: Roles,
) -> None:
    await _run_replica(roles, "replica")  # some runs to read
    [[job]] = await _fetch(roles, f'SELECT job FROM "{roles.schema}"."{TABLE}" LIMIT 1')
    for args in (("status",), ("history", job), ("schedules", "list")):
        done = _cli_as(roles, "reader", *args)
        assert done.returncode == 0, (args, done.stderr)
    check = _cli_as(roles, "reader", "status", "--check", "--allow-absent")
    assert check.returncode in (0, 1), check.stderr  # a verdict, not "cannot read"
    app = cronlock.web.app(roles.dsn("reader"), table=TABLE, schema=roles.schema)
    async with _browser(app) as browser:
        for path in ("/", "/api/jobs", "/schedules", f"/jobs/{job}"):
            page = await browser.get(path)
            assert page.status_code == 200, (path, page.text)
    # The secrets table (the dashboard's CSRF key) is not the reader's to read.
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await _as(roles, "reader", f'SELECT value FROM "{roles.schema}"."{TABLE}_secrets"')
    refused = _cli_as(roles, "reader", "pause", job)
    assert refused.returncode == 3, refused.stderr
    assert f'INSERT on "{roles.schema}"."{TABLE}_control"' in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1


# -- one grant fewer ---------------------------------------------------------------------


@dataclass(frozen=True)
class Fewer:
    part: str
    privilege: str  # as a GRANT names it
    on: str  # a table suffix, or "SCHEMA"
    verb: tuple[str, ...]  # a command line verb, or ("replica", mode)

    def __str__(self) -> str:
        return f"{self.part}-{self.privilege}-{self.on or 'runs'}-{self.verb[0]}"


FEWER = [
    Fewer("reader", "USAGE", "SCHEMA", ("status",)),
    Fewer("reader", "SELECT", "", ("history", "j")),
    Fewer("reader", "SELECT", "_jobs", ("status",)),
    Fewer("reader", "SELECT", "_control", ("status",)),
    Fewer("reader", "SELECT", "_leases", ("status",)),
    Fewer("reader", "SELECT", "_members", ("status",)),
    Fewer("reader", "SELECT", "_definitions", ("status",)),
    Fewer("reader", "SELECT", "_schedules", ("schedules", "list")),
    Fewer("operator", "INSERT", "_control", ("pause", "j", "--force")),
    Fewer("operator", "UPDATE", "_control", ("resume", "j", "--force")),
    Fewer("operator", "UPDATE", "_jobs", ("retire", "j", "--force")),
    Fewer("operator", "INSERT", "_schedules", ("schedules", "add", "f:1", "t", "--every", "60")),
    Fewer("operator", "DELETE", "_jobs", ("schedules", "remove", "f:2")),
    Fewer("replica", "INSERT", "", ("replica", "session")),
    Fewer("replica", "DELETE", "_members", ("replica", "session")),
    Fewer("replica", "SELECT", "_control", ("replica", "lease")),
    Fewer("replica", "INSERT", "_leases", ("replica", "lease")),
    Fewer("replica", "UPDATE", "_definitions", ("replica", "session")),
]


@pytest.mark.parametrize("fewer", FEWER, ids=str)
async def test_one_grant_fewer_is_refused_naming_the_privilege(roles: Roles, fewer: Fewer) -> None:
    role = quote_ident(roles.names[fewer.part])
    if fewer.on == "SCHEMA":
        target, named = f"SCHEMA {quote_ident(roles.schema)}", "USAGE on schema"
    else:
        table = f'"{roles.schema}"."{TABLE}{fewer.on}"'
        target, named = f"TABLE {table}", f"{fewer.privilege} on {table}"
    if fewer.verb == ("schedules", "remove", "f:2"):  # a schedule to remove
        added = _cli_as(roles, "owner", "schedules", "add", "f:2", "t", "--every", "60")
        assert added.returncode == 0, added.stderr
    await _as(roles, "owner", f"REVOKE {fewer.privilege} ON {target} FROM {role}")
    try:
        if fewer.verb[0] == "replica":
            with pytest.raises(LockerMisconfigured) as refused:
                await _run_replica(roles, "replica", mode=fewer.verb[1], runs=0)
            assert named in str(refused.value), str(refused.value)
            return
        done = _cli_as(roles, fewer.part, *fewer.verb)
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert named in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    finally:
        await _as(roles, "owner", f"GRANT {fewer.privilege} ON {target} TO {role}")


# -- exit statuses -----------------------------------------------------------------------


async def test_the_exit_statuses_tell_usage_from_a_ledger_that_cannot_be_read(
    roles: Roles, unreachable_dsn: str
) -> None:
    # Each status once in a process of its own (as a shell sees it), the rest in this one.
    cases = [
        (("status", "--check", "--dsn", unreachable_dsn), 3, _here),  # the server is down
        (("status", "--check", "--dsn", roles.dsn("reader"), "--table", "nothing_here"), 3, _cli),
        (
            ("status", "--check", "--dsn", roles.dsn("reader"), "--schema", "no_such_schema"),
            3,
            _here,
        ),
        (("status", "--bogus"), 2, _cli),
        (("status", "--dsn", "not a dsn"), 2, _here),
    ]
    for args, status, run in cases:
        done = run(*args)
        assert done.returncode == status, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    deep = "[" * 980 + "]" * 980
    nested = _cli(
        "schedules", "add", "deep", "echo", "--every", "60", "--kwargs", '{"a": ' + deep + "}",
        "--dsn", roles.dsn("operator"), "--schema", roles.schema,
    )  # fmt: skip
    assert nested.returncode == 1, nested.stderr  # refused input, as any bad --kwargs
    assert "Traceback" not in nested.stderr and "nested too deeply" in nested.stderr
