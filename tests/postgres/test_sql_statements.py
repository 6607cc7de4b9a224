"""Every statement of ``cronlock/postgres/_sql/`` against a ledger ``migrate`` just made.

Each is built for a fresh ledger (a table name that needs quoting) and the server plans it
with ``EXPLAIN``, its parameters NULL, inferred by the server or typed by the statement:
nothing runs, yet a statement that no longer parses against the schema (a column renamed,
a table missing, a parameter of two types) fails here, in whichever mode it is used. The
statements are found by reading the folder's modules, so a new one is covered unless it
is of a shape this test does not know, which fails too (``test_every_name_is_known``).

``EXPLAIN`` does not take DDL or ``SET``: those are run instead, the DDL again on the
current ledger (each statement is idempotent), ``SET`` inside a transaction rolled back,
and the schema drop on a ledger of its own in a throwaway schema.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import cronlock.postgres._sql as sql_package
from cronlock.postgres._sql.definitions import conflicted_sql
from cronlock.postgres._sql.elector import (
    leaders_acquire_sql,
    leaders_ddl,
    leaders_release_sql,
    leaders_renew_sql,
)
from cronlock.postgres._sql.fleet import bounded_sql
from cronlock.postgres._sql.runs import RUN_COLUMNS, last_runs_sql, latest_run
from cronlock.postgres._sql.schema import (
    drop_schema_sql,
    ledger_ddl,
    ledger_state,
    lock_timeout_sql,
    migrate,
)
from cronlock.postgres._sql.sessions import cache_probe_sql, set_config_sql
from cronlock.postgres._sql.tables import LedgerTable

from ..throwaway import prefix

pytestmark = pytest.mark.postgres

_STATEMENT = re.compile(r"\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|SET)\b")
_EXPLAINED = re.compile(r"\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH)\b|\s*\(")
# Public names of the folder that are not statements of a ledger (value, type, reader,
# runner), and fragments and builders that take more than a ledger: each is covered
# through the statements built from it, or below.
_NOT_STATEMENTS = frozenset(
    {
        # tables.py
        "DEFAULT_TABLE",
        "LedgerTable",
        "quote_ident",
        # runs.py: guards, decoding, fragments; latest_run and the claims' told columns
        "CLAIMED_START",
        "HIGH",
        "LOW",
        "Latest",
        "Prefixed",
        "RUN",
        "RUN_COLUMNS",
        "R_RUN",
        "HISTORY_COLUMNS",
        "decode_attempts",
        "decode_history",
        "decode_run",
        "latest_run",
        "odd_list",
        "real_start",
        "report_odd",
        "run_list",
        "sane",
        "skipped",
        "slot_in_range",
        "to_record",
        "told_columns",
        # claims.py: the fragments both modes' claims and ends are made of
        "claim_inputs",
        "end_ctes",
        # crashes.py: the owner rules and the end of a crashed run the crash checks add
        # (covered through them)
        "owner_gone",
        "sessions_gone",
        "last_sign_of_life",
        # upkeep.py: the members' period and time to live (values)
        "MEMBERS_EVERY",
        "MEMBER_TTL",
        # schema.py: the runner, its reader, the state's type; the DDL parts of ledger_ddl;
        # the statements run below rather than explained
        "LedgerState",
        "first_seen_ddl",
        "schedules_ddl",
        "definitions_ddl",
        "ledger_state",
        "migrate",
        "lock_timeout_sql",
        "drop_schema_sql",
        "create_schema_sql",  # needs a schema: run by the roles' tests (test_roles.py)
        # grants.py: the roles' grants, as values and GRANT text (applied in test_roles.py)
        "ROLES",
        "Grant",
        "Role",
        "role_grants",
        "grant_statements",
        "missing_privileges",
        # stored.py
        "NONE_REMOVED",
        "decode_changes",
        "decode_stored",
        "LOCK_ROW",
        # fleet.py: the dashboard's wrapper of a read (explained below); the absent rule's
        # seconds (a value)
        "bounded_sql",
        "ABSENT_AFTER",
        # crashes.py: the takeover's condition and the attempts it keeps, fragments of
        # recover_sql and its lease form
        "TAKEN_OVER",
        "KEPT_ATTEMPTS",
        # elector.py: the leaders table's statements, built from its quoted name (below)
        "leaders_acquire_sql",
        "leaders_ddl",
        "leaders_release_sql",
        "leaders_renew_sql",
        # sessions.py: settings set in one round trip, as many as given (run below)
        "set_config_sql",
        # definitions.py: how long a gone replica's rows stay, a read's row limit (values)
        "STALE_AFTER",
        "CONFLICTS_LIMIT",
    }
)


def _modules() -> Iterator[Any]:
    for info in pkgutil.iter_modules(sql_package.__path__):
        yield importlib.import_module(f"{sql_package.__name__}.{info.name}")


def _takes_a_ledger(fn: Any) -> bool:
    """Whether *fn* is built from a ledger alone (its other parameters have defaults)."""
    params = list(inspect.signature(fn).parameters.values())
    return (
        bool(params)
        and params[0].annotation in ("LedgerTable", LedgerTable)
        and all(p.default is not p.empty for p in params[1:])
    )


def _statements(table: LedgerTable) -> dict[str, str]:
    """Every statement of the folder for *table*, by where it comes from; and the names of
    the folder that are neither a statement nor listed as something else."""
    found: dict[str, str] = {}
    for module in _modules():
        short = module.__name__.rpartition(".")[2]
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            where = f"{short}.{name}"
            if name in _NOT_STATEMENTS:
                continue
            if isinstance(value, str) and _STATEMENT.match(value):
                found[where] = value
            elif callable(value) and _takes_a_ledger(value):
                built = value(table)
                if isinstance(built, str):
                    found[where] = built
                elif isinstance(built, dict):
                    found.update({f"{where}[{key!r}]": text for key, text in built.items()})
                elif isinstance(built, list):
                    found.update({f"{where}[{i}]": text for i, text in enumerate(built)})
                else:
                    found[where] = f"unknown: {built!r}"
            else:
                found[where] = f"unknown: {value!r}"
    # The builders that take more than a ledger, as their callers use them.
    found["sessions.cache_probe_sql"] = cache_probe_sql("0123abcd")
    for kind in ("last", "ok", "failed"):
        found[f"runs.latest_run({kind!r})"] = latest_run(table.runs, "$1::text", kind)
    found["fleet.bounded_sql(last_runs_sql)"] = bounded_sql(
        last_runs_sql(table),
        ("kind", *RUN_COLUMNS),
        " ORDER BY q.slot DESC",
        instants=frozenset({"slot", "started_at", "finished_at"}),
        earliest="0001-01-03 00:00:00+00",
        latest="9999-12-29 00:00:00+00",
        prefixes={"error": 100},
    )
    return found


def _table() -> LedgerTable:
    return LedgerTable(f'sql "{uuid.uuid4().hex[:8]}" runs')


def test_every_name_is_known() -> None:
    unknown = {k: v for k, v in _statements(_table()).items() if v.startswith("unknown: ")}
    assert unknown == {}
    names = {name for module in _modules() for name in getattr(module, "__all__", ())}
    assert sorted(_NOT_STATEMENTS - names) == []  # an entry the folder no longer has
    # And what it finds is a fair count of the folder (a renamed __all__ would hide some).
    assert len(_statements(_table())) > 60


async def test_every_statement_plans_on_a_fresh_ledger(admin: Any) -> None:
    table = _table()
    assert await migrate(admin, table) == "created"
    failed: dict[str, str] = {}
    explained = run = 0
    for where, text in _statements(table).items():
        try:
            if _EXPLAINED.match(text):
                # "EXPLAIN (" would open EXPLAIN's options: a union of parenthesised
                # selects (last_runs_sql) is explained as a subquery.
                wrapped = f"SELECT * FROM ({text}) AS q" if text.lstrip()[0] == "(" else text
                statement = await admin.prepare(f"EXPLAIN {wrapped}")
                await statement.fetch(*[None] * len(statement.get_parameters()))
                explained += 1
            else:  # DDL (idempotent on the ledger made above) and SET, rolled back
                transaction = admin.transaction()
                await transaction.start()
                try:
                    await admin.execute(text)
                finally:
                    await transaction.rollback()
                run += 1
        except Exception as exc:
            failed[where] = f"{type(exc).__name__}: {exc}"
    assert failed == {}
    assert explained > 50
    ddl = [text for text in ledger_ddl(table) if not _EXPLAINED.match(text)]
    assert run == len(ddl) + 2  # the DDL, and the two SET constants
    assert await ledger_state(admin, table) == "current"
    # The conflicts' read of some jobs (the status verb's), beside that of all of them.
    prepared = await admin.prepare(f"EXPLAIN {conflicted_sql(table, named=True)}")
    await prepared.fetch(None)
    async with admin.transaction():  # migrate's own SET, which takes a number
        await admin.execute(lock_timeout_sql(1.5))
        assert await admin.fetchval("SHOW lock_timeout") == "1500ms"


async def test_the_schema_drop_drops_a_ledger_of_its_own(admin: Any) -> None:
    # A throwaway name: one left by a killed run is dropped by the next (tests/throwaway.py).
    table = LedgerTable("runs", f"{prefix()}{os.getpid()}_{uuid.uuid4().hex[:6]}")
    try:
        assert await migrate(admin, table) == "created"
    finally:
        await admin.execute(drop_schema_sql(table))
    assert await ledger_state(admin, table) == "missing"
    with pytest.raises(ValueError, match="names no schema"):
        drop_schema_sql(_table())


async def test_the_election_statements_plan_on_their_table(admin: Any) -> None:
    """The lease-mode elector's table, made by its DDL, and its statements planned on it;
    the session settings statement run and rolled back."""
    name = f'"leaders {uuid.uuid4().hex[:8]}"'
    try:
        for statement in leaders_ddl(name):
            await admin.execute(statement)
        for text in (leaders_acquire_sql(name), leaders_renew_sql(name)):
            prepared = await admin.prepare(f"EXPLAIN {text}")
            await prepared.fetch(*[None] * len(prepared.get_parameters()))
        prepared = await admin.prepare(f"EXPLAIN {leaders_release_sql(name)}")
        await prepared.fetch(None, None)
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS {name}")
    transaction = admin.transaction()
    await transaction.start()
    try:  # rolled back: the fixture's connection keeps its own settings
        await admin.execute(set_config_sql(2), "application_name", "x", "lock_timeout", "1s")
        assert await admin.fetchval("SHOW lock_timeout") == "1s"
    finally:
        await transaction.rollback()
