"""The README's main command, against the real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

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
