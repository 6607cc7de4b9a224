"""The README's main command, against the real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from .pgbouncer import PgBouncer

pytestmark = pytest.mark.postgres

SLOT_LINE = re.compile(r"  \d\d:\d\d:\d\d  ")


def demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronlock", "demo", "--replicas", "3", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def slot_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if SLOT_LINE.match(line)]


async def test_demo_with_postgres_runs_each_slot_once_and_drops_its_schema(
    pg_dsn: str, admin: Any
) -> None:
    result = demo("--duration", "4", "--skew", "0.3", "--dsn", pg_dsn)
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("backend: PostgreSQL ")
    assert "(from --dsn): advisory locks and the run ledger, in schema cronlock_demo_" in first
    [schema] = re.findall(r"in schema (cronlock_demo_[0-9a-f]{8}) \(dropped at the end\)", first)
    slots = slot_lines(result.stdout)
    assert len(slots) == 4
    # The replicas behind find the slot claimed in the ledger, however late they come.
    for line in slots:
        assert re.fullmatch(
            r"  \d\d:\d\d:\d\d  ran on replica-[123]  "
            r"skipped: replica-\d \((already ran|locked)\), replica-\d \((already ran|locked)\)",
            line,
        ), line
    assert any("(already ran)" in line for line in slots)
    assert result.stdout.splitlines()[-1] == "slots 4, runs 4, duplicates 0, missed 0"
    # Nothing is left behind for `status` to show.
    assert await admin.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema) == 0


def test_demo_lock_only_with_skewed_clocks_shows_the_duplicates(pg_dsn: str) -> None:
    # CRONLOCK_DSN is used when there is no --dsn.
    result = demo("--duration", "3", "--skew", "0.3", "--lock-only", env={"CRONLOCK_DSN": pg_dsn})
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("backend: PostgreSQL ")
    assert lines[0].endswith("(from CRONLOCK_DSN): advisory locks only, no run ledger")
    assert "clocks +0.00s, -0.30s, -0.60s" in lines[1]
    slots = slot_lines(result.stdout)
    assert len(slots) == 3
    # A replica 300 ms behind finds the lock free again once the first run released it.
    assert any(re.search(r"ran on replica-\d, replica-\d.*DUPLICATE", line) for line in slots)
    summary = re.fullmatch(r"slots 3, runs (\d+), duplicates (\d+), missed 0", lines[-1])
    assert summary is not None, lines[-1]
    runs, duplicates = map(int, summary.groups())
    assert duplicates >= 1
    assert runs == 3 + duplicates
    assert "without --lock-only the run ledger" in lines[-2]


async def test_demo_through_a_transaction_pooler_runs_in_lease_mode(
    pgbouncer: PgBouncer, admin: Any
) -> None:
    # The docs' quickest check of a DSN: through PgBouncer in transaction mode the demo
    # says so, runs its replicas in lease mode, and names the pooler's port, not the
    # server's.
    result = demo("--duration", "3", "--dsn", pgbouncer.dsn)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    first = lines[0]
    assert first.startswith("backend: PostgreSQL ")
    assert f" on 127.0.0.1:{pgbouncer.port} (from --dsn)" in first, first
    assert "through a connection pooler" in first, first
    assert ": leases and the run ledger, in schema cronlock_demo_" in first, first
    [schema] = re.findall(r"in schema (cronlock_demo_[0-9a-f]{8}) \(dropped at the end\)", first)
    slots = slot_lines(result.stdout)
    assert len(slots) == 3
    for line in slots:  # once each (a loser's report may come too late for its line)
        assert re.match(r"  \d\d:\d\d:\d\d  ran on replica-[123](  |$)", line), result.stdout
        assert "DUPLICATE" not in line and "MISSED" not in line, result.stdout
    assert lines[-1] == "slots 3, runs 3, duplicates 0, missed 0"
    assert await admin.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema) == 0


def test_demo_in_session_mode_through_a_pooler_says_why_it_cannot(pgbouncer: PgBouncer) -> None:
    result = demo("--duration", "3", "--mode", "session", "--dsn", pgbouncer.dsn)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [message] = result.stderr.splitlines()
    assert message.startswith("cronlock: error: ")
    assert "connection pooler" in message and "--mode lease" in message, message
    assert result.stdout == ""  # refused before any replica started


def test_demo_names_the_dsns_address(pg_server: str, pg_dsn: str) -> None:
    # The banner's host:port is the DSN's, as given (here the server's own).
    port = str(urlsplit(pg_server).port or 5432)
    result = demo("--duration", "1", "--dsn", pg_dsn)
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert f" on 127.0.0.1:{port} (from --dsn): advisory locks and the run ledger" in first
