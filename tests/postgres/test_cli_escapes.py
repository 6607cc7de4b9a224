"""``status`` and ``history`` print the ledger's text escaped: a job name, an error, a
host or a schedule holding terminal escapes (a screen clear, an OSC 52 clipboard write, a
``\\r`` faking a line, a bidi override) reach the operator's terminal as ``\\x1b``,
``\\r``, ``\\u202e``; and odd rows crash neither the health probe (``status --check``)
nor ``history`` (issue 24, item 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.web.seed import Run, seed, table_name

from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

NOW = datetime.now(UTC).replace(microsecond=0)
CLEAR = "\x1b[2J"
CLIPBOARD = "\x1b]52;c;aGFja2Vk\x07"  # OSC 52: "hacked" into the clipboard
JOB = f"evil{CLEAR}\u202ejob"
ERROR = f"RuntimeError: boom{CLIPBOARD}\r{' ' * 20}all good\n2nd line"
HOST = "replica\x1b[31m-red\x9b1m"  # an SGR, and a one-byte C1 CSI
SCHEDULE = f"every 1h{CLEAR}"
# Characters that must never reach a terminal raw.
RAW = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F)]}
RAW |= {chr(c) for c in range(0x2066, 0x206A)}


def _raw_in(text: str) -> set[str]:
    """The raw control characters in *text*, newlines between lines aside."""
    return {char for line in text.split("\n") for char in line} & RAW


async def _seeded(pg_dsn: str, admin: Any) -> str:
    table = table_name()
    old = NOW - timedelta(hours=3)
    ledger = await seed(
        pg_dsn,
        table,
        # The replicas note its next slot on (it is not absent); its due slot is late.
        notes=[(JOB, SCHEDULE, NOW + timedelta(hours=2)), ("plain", "every 1h", None)],
        runs=[
            Run(JOB, old, "succeeded", host=HOST),
            Run(JOB, old + timedelta(hours=1), "failed", error=ERROR, host=HOST),
            # Odd rows: an outcome no cronlock writes, an empty host, a run that ended
            # before it started, an error of control characters only.
            Run("plain", old, f"weird{CLEAR}", host="", took=-5, error="\x1b\x1b\x07"),
        ],
    )
    # Timestamps of +-infinity, which asyncpg reads as naive datetimes.
    await admin.execute(
        f"INSERT INTO {ledger.jobs} (job, schedule, next_run, grace, due) "
        "VALUES ('forever', 'x', 'infinity', 1, '-infinity')"
    )
    await admin.execute(
        f"INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at, outcome)"
        " VALUES ('forever', 'infinity', 'h', 1, '-infinity', 'infinity', 'failed')"
    )
    # Overdue: due an hour ago, with a one-second grace (what --check reports).
    await admin.execute(
        f"UPDATE {ledger.jobs} SET grace = 1, due = $2 WHERE job = $1",
        JOB,
        NOW - timedelta(hours=1),
    )
    return table


async def test_status_and_history_escape_the_ledgers_text(pg_dsn: str, admin: Any) -> None:
    table = await _seeded(pg_dsn, admin)
    try:
        status = await cli("status", "--dsn", pg_dsn, "--table", table)
        assert status.returncode == 0, status.stderr
        assert _raw_in(status.stdout) == set()
        assert "evil\\x1b[2J\\u202ejob" in status.stdout
        assert "every 1h\\x1b[2J" in status.stdout

        check = await cli("status", "--check", "--dsn", pg_dsn, "--table", table)
        assert check.returncode == 1, check.stderr
        assert _raw_in(check.stdout) == set()
        assert check.stdout.splitlines()[-1] == "overdue: evil\\x1b[2J\\u202ejob"

        history = await cli("history", JOB, "--dsn", pg_dsn, "--table", table)
        assert history.returncode == 0, history.stderr
        assert _raw_in(history.stdout) == set()
        # One line a run: the error's \r and \n are escaped, not obeyed.
        assert len(history.stdout.splitlines()) == 2 + 2
        assert "replica\\x1b[31m-red\\x9b1m:4242" in history.stdout
        assert "boom\\x1b]52;c;aGFja2Vk\\x07\\r" in history.stdout
        assert "all good\\n2nd line" in history.stdout

        odd = await cli("history", "plain", "--dsn", pg_dsn, "--table", table)
        assert odd.returncode == 0, odd.stderr
        assert _raw_in(odd.stdout) == set()
        # (an outcome no cronlock writes is decoded by the readers' rule, shown nowhere raw)
        assert "\\x1b\\x1b\\x07" in odd.stdout

        forever = await cli("history", "forever", "--dsn", pg_dsn, "--table", table)
        assert forever.returncode == 0, forever.stderr
        # Its one run has no readable instant: left out, and said (cronlock.postgres._sql.runs).
        assert forever.stdout.startswith("no runs of 'forever'")
        assert "(slot=infinity, started_at=-infinity, finished_at=infinity)" in forever.stderr
        rows = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[2:]}
        assert rows["forever"] == "new"  # no run it can read, a due slot it cannot judge

        # A name the ledger does not know, close to one it does: the hint is escaped too.
        unknown = await cli("history", "evil", "--dsn", pg_dsn, "--table", table)
        assert unknown.returncode == 1
        assert _raw_in(unknown.stderr) == set()
    finally:
        conn = await asyncpg.connect(pg_dsn)
        try:
            for suffix in ("", "_jobs", "_control", "_members", "_secrets", "_definitions"):
                await conn.execute(f'DROP TABLE IF EXISTS "{table}{suffix}"')
        finally:
            await conn.close()
