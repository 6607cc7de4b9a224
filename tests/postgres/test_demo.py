"""The README's main command, against the real server."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.postgres


def test_demo_with_postgres_runs_each_slot_once(pg_dsn: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cronlock",
            "demo",
            "--replicas",
            "3",
            "--duration",
            "5",
            "--dsn",
            pg_dsn,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PostgreSQL" in result.stdout.splitlines()[0]
    assert result.stdout.splitlines()[-1] == "slots 5, runs 5, duplicates 0, missed 0"
