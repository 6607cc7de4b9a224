"""Where the command line's ledger verbs find their database, and what a connect error
shows of it (issue 24, items 2 and 3).

A password with an unescaped ``/``, ``#`` or ``?`` makes asyncpg read a piece of it as the
port, and its error quotes that piece: cronlock never repeats such an error, on the
command line, in a LockError or in a log. ``--dsn`` may be left out: ``$CRONLOCK_DSN``,
then libpq's ``PG*`` variables, keep the password out of ``ps``.
"""

from __future__ import annotations

import logging
import os
import traceback
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest

from cronlock import LockError
from cronlock.postgres import PostgresLocker, locked_run
from cronlock.postgres._sql.tables import quote_ident

from .test_cli_pg import cli, cli_here

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
MALFORMED = "postgresql://u:pa/ss#w?rd@127.0.0.1:5432/test"
# What of the password an error could show: asyncpg's says "... base 10: 'pa'".
FRAGMENTS = ("pa/ss", "'pa'", "w?rd", "ss#w", "rd@")
_PG_VARS = ("PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGPASSFILE", "PGSSLMODE")


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without any database setting, plus *extra*."""
    env = {k: v for k, v in os.environ.items() if k not in _PG_VARS and k != "CRONLOCK_DSN"}
    env.update(extra)
    return env


def _no_password(text: str) -> None:
    for fragment in FRAGMENTS:
        assert fragment not in text, text


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"cli_dsn_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


@pytest.mark.parametrize("verb", [["status"], ["history", "j"], ["migrate"], ["pause", "j"]])
async def test_a_malformed_dsn_never_shows_its_password(verb: list[str]) -> None:
    # ``status`` in a process of its own (what a terminal shows), the others here.
    run = cli if verb == ["status"] else cli_here
    for args, env in (
        ([*verb, "--dsn", MALFORMED], _env()),
        (verb, _env(CRONLOCK_DSN=MALFORMED)),
    ):
        result = await run(*args, env=env)
        assert result.returncode == 2
        assert result.stdout == ""
        _no_password(result.stderr)
        [line] = result.stderr.splitlines()
        source = "--dsn" if "--dsn" in args else "CRONLOCK_DSN"
        assert line.startswith(f"cronlock: error: cannot connect to PostgreSQL with {source}: ")
        assert "the DSN could not be parsed" in line
        assert "percent-encoded" in line


async def test_the_locker_and_locked_run_never_show_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="cronlock")
    shown: list[str] = []
    locker = PostgresLocker(MALFORMED)
    try:
        for _ in range(2):  # the failed connect, then the refusal while backing off
            with pytest.raises(LockError) as caught:
                await locker.acquire("job", SLOT)
            shown.append("".join(traceback.format_exception(caught.value)))
    finally:
        await locker.close()
    assert "percent-encoded" in shown[0]
    with pytest.raises(LockError) as refused:
        async with locked_run(MALFORMED, "job"):
            pass
    shown.append("".join(traceback.format_exception(refused.value)))
    assert "the DSN could not be parsed" in str(refused.value)
    handler = logging.Formatter()
    shown += [handler.format(record) for record in caplog.records]
    assert any(r.levelno == logging.ERROR for r in caplog.records)  # the outage is told
    _no_password("\n".join(shown))


async def test_a_password_in_the_servers_answer_is_taken_out(pg_server: str) -> None:
    # A DSN that parses: the server's answer is shown (here: no such database), and the
    # password, which the server echoes nowhere, would be masked if it did.
    parts = urlsplit(pg_server)
    dsn = f"postgresql://{parts.username}:s3cret-pw@{parts.hostname}:{parts.port}/nodb_{uuid.uuid4().hex[:6]}"
    result = await cli("status", "--dsn", dsn, env=_env())
    assert result.returncode == 3  # the server's answer: the ledger cannot be read
    assert "s3cret-pw" not in result.stderr
    assert "does not exist" in result.stderr
    assert f"{parts.username}@{parts.hostname}:{parts.port}/nodb_" in result.stderr


async def test_cronlock_dsn_stands_in_for_dsn(pg_dsn: str, schema: str) -> None:
    env = _env(CRONLOCK_DSN=pg_dsn)
    done = await cli_here("migrate", "--schema", schema, env=env)
    assert done.returncode == 0, done.stderr
    status = await cli_here("status", "--schema", schema, env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f'run ledger "{schema}"."cronlock_runs": 0 job(s)')
    # --dsn, when given, wins over the environment.
    wrong = await cli_here("status", "--schema", schema, "--dsn", "not a dsn", env=env)
    assert wrong.returncode == 2
    assert "with --dsn" in wrong.stderr


async def test_libpq_variables_stand_in_when_neither_is_given(pg_dsn: str, schema: str) -> None:
    parts = urlsplit(pg_dsn)
    env = _env(
        PGHOST=parts.hostname or "",
        PGPORT=str(parts.port or 5432),
        PGUSER=parts.username or "",
        PGDATABASE=parts.path.lstrip("/"),
        **({"PGPASSWORD": parts.password} if parts.password else {}),
    )
    # In a process of its own: asyncpg reads libpq's variables from the environment it
    # was started with.
    done = await cli("migrate", "--schema", schema, env=env)
    assert done.returncode == 0, done.stderr
    status = await cli_here("status", "--schema", schema, env=env)
    assert status.returncode == 0, status.stderr


@pytest.mark.parametrize("verb", [["status"], ["history", "j"], ["web"]])
async def test_no_database_at_all_is_a_clear_error(verb: list[str]) -> None:
    # ``web`` in a process of its own: here, a dashboard that started would wait for a
    # signal that a thread cannot take.
    run = cli if verb == ["web"] else cli_here
    result = await run(*verb, env=_env())
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "no database to connect to: pass --dsn, or set CRONLOCK_DSN" in line
