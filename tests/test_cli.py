"""The command line, run as users run it: ``python -m cronlock ...`` in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def cronlock(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronlock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_next_prints_local_and_utc_slots() -> None:
    result = cronlock(
        "next",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "-n",
        "3",
        "--after",
        "2026-03-07T00:00:00+00:00",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:] == [
        "  2026-03-07 02:30 EST    (-0500)  =  2026-03-07 07:30 UTC",
        # 02:30 does not exist on spring-forward day: once, right after the gap.
        "  2026-03-08 03:00 EDT    (-0400)  =  2026-03-08 07:00 UTC",
        "  2026-03-09 02:30 EDT    (-0400)  =  2026-03-09 06:30 UTC",
    ]


def test_next_with_seconds_field_first() -> None:
    result = cronlock(
        "next", "15 0 3 * * *", "--seconds", "-n", "1", "--after", "2026-01-01T00:00:00+00:00"
    )
    assert result.returncode == 0, result.stderr
    assert "2026-01-01 03:00:15 UTC" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("next", "0 3 * *"), "expected 5 fields"),
        (("next", "0 25 * * *"), "25"),
        (("next", "0 0 31 2 *"), "never fires"),
        (("next", "@daily", "--tz", "Mars/Olympus"), "Mars/Olympus"),
        (("next", "@daily", "-n", "0"), "-n"),
        (("next", "@daily", "--after", "yesterday"), "--after"),
        (("next", "@daily", "--after", "2026-01-01T00:00"), "naive"),
    ],
)
def test_bad_input_is_one_clear_line_and_status_2(args: tuple[str, ...], needle: str) -> None:
    result = cronlock(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert needle in result.stderr


def test_demo_runs_each_slot_once_with_file_locks() -> None:
    result = cronlock("demo", "--replicas", "3", "--duration", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    slot_lines = [line for line in result.stdout.splitlines() if " UTC  " in line]
    assert len(slot_lines) == 4
    assert all(re.search(r"UTC  replica [123]$", line) for line in slot_lines)
    assert result.stdout.splitlines()[-1] == "slots 4, runs 4, duplicates 0, missed 0"


def test_demo_with_unreachable_database_is_one_line_and_status_2() -> None:
    result = cronlock("demo", "--dsn", "postgresql://nobody@127.0.0.1:9/none", timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot connect to PostgreSQL" in result.stderr
