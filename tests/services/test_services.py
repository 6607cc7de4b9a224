"""The example services run as in production: several worker processes under a real server.

``examples/fastapi_app.py`` runs under uvicorn's multiprocess supervisor, and
``examples/aiohttp_app.py`` under gunicorn's aiohttp worker, three workers each, on a real
PostgreSQL server. Each worker has its own scheduler; the test then checks what an operator
would check:

- each slot of each job ran exactly once across the workers (the example's heartbeat
  table has one row per run and no unique key: a slot run twice shows as two rows), none
  is missing between the first and the last one seen, and the run ledger agrees;
- SIGTERM to the master ends the service with its graceful exit status (0), within
  ``stop_timeout`` plus a margin, and a slow run in flight at that moment finished after
  it (its row and its ledger entry), or, with a ``stop_timeout`` shorter than its remaining
  work, was cancelled and recorded ``cancelled`` in the ledger;
- no session of the service is left in ``pg_stat_activity``, and its stderr has no
  traceback, no ``Task was destroyed``, no ``ResourceWarning``; also when the service is
  stopped while its workers boot (their schedulers stop as they start).

Timings are printed (``[measured]``), never asserted: the bounds below only stop a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ..eventually import eventually
from .conftest import free_port

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.usefixtures("examples_extra")]

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
HEARTBEAT = timedelta(seconds=1)
REPORT = timedelta(seconds=5)  # REPORT_CRON below
REPORT_SECONDS = 4  # how long a report run works: most of the time one is in flight
# The schedulers' stop_timeout: longer than a report run (it is waited for), or shorter
# (it is cancelled).
LONG_STOP, SHORT_STOP = 10.0, 1.0
# The servers' own graceful timeouts must exceed stop_timeout, or they would kill a worker
# whose scheduler is still waiting for a run in flight.
SERVER_GRACE_MARGIN = 20
# Generous bounds for conditions polled on two noisy cores; reaching one is a failure.
STARTUP_BOUND = 120.0
RUNNING_BOUND = 120.0
EXIT_MARGIN = 60.0  # past stop_timeout
SESSIONS_BOUND = 30.0
HEARTBEATS_BEFORE_STOP = 8
TRACEMALLOC_HINT = "ResourceWarning: Enable tracemalloc to get the object allocation traceback"
# Lines that mean a worker did not shut down cleanly.
BAD_STDERR = (
    "Traceback",
    "Task was destroyed",
    "ResourceWarning",
    "never awaited",
    "Unclosed",
    "ERROR",
    "CRITICAL",
)


@dataclass
class Observed:
    """What a run of a service showed, for the checks and the [measured] line."""

    label: str
    stop_timeout: float
    port: int = 0
    worker_pids: set[int] = field(default_factory=set)
    served_by: set[int] = field(default_factory=set)
    cronlock_sessions: int = 0
    in_flight: dict[str, Any] = field(default_factory=dict)
    sigterm_at: datetime | None = None
    exit_status: int | None = None
    shutdown_seconds: float = 0.0
    sessions_left: int = -1
    rows: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[tuple[str, datetime], dict[str, Any]] = field(default_factory=dict)
    stderr: str = ""


WORKERS_SQL = (
    "SELECT DISTINCT split_part(application_name, ':', 3)::int FROM pg_stat_activity "
    "WHERE application_name LIKE $1"
)
SESSIONS_SQL = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1"


def uvicorn_command(port: int, grace: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "examples.fastapi_app:app",
        "--workers",
        str(WORKERS),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--timeout-graceful-shutdown",
        str(grace),
    ]


def gunicorn_command(port: int, grace: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "examples.aiohttp_app:app_factory",
        "--worker-class",
        "aiohttp.GunicornWebWorker",
        "--workers",
        str(WORKERS),
        "--bind",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        str(grace),
    ]


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.load(response)


async def watch_it_run(
    seen: Observed,
    port: int,
    admin: Any,
    table: str,
    app_name: str,
    prefix: str,
    *,
    alive: Callable[[], None],
) -> None:
    """Ask the service over HTTP, then wait until a report run has just started."""

    async def answering() -> Any:
        alive()
        try:
            return await asyncio.to_thread(get_json, port, "/jobs")
        except OSError:
            return None

    view = await eventually(answering, "GET /jobs answered", STARTUP_BOUND, every=0.1)
    assert {job["name"] for job in view["jobs"]} == {f"{prefix}heartbeat", f"{prefix}report"}
    assert all(job["next_run"] is not None for job in view["jobs"])
    for _ in range(6):  # served by whichever worker the kernel hands the connection
        seen.served_by.add((await asyncio.to_thread(get_json, port, "/jobs"))["pid"])
    assert seen.served_by <= seen.worker_pids

    async def report_just_started() -> dict[str, Any] | None:
        alive()
        beats = await admin.fetchval(
            f'SELECT count(*) FROM "{table}" WHERE job = $1', f"{prefix}heartbeat"
        )
        if beats < HEARTBEATS_BEFORE_STOP:
            return None
        # Started less than a second ago: it has seconds of work left at SIGTERM.
        row = await admin.fetchrow(
            f'SELECT id, slot, pid FROM "{table}" '
            "WHERE job = $1 AND finished_at IS NULL "
            "AND started_at > clock_timestamp() - interval '1 second'",
            f"{prefix}report",
        )
        return None if row is None else dict(row)

    seen.in_flight = await eventually(
        report_just_started, "a report run started", RUNNING_BOUND, every=0.1
    )
    recent = await asyncio.to_thread(get_json, port, "/heartbeats?limit=5")
    assert len(recent["rows"]) == 5
    seen.cronlock_sessions = await admin.fetchval(SESSIONS_SQL, f"{app_name}:cronlock:%")


async def exercise(
    label: str,
    command: Callable[[int, int], list[str]],
    pg_dsn: str,
    admin: Any,
    tmp_path: Path,
    *,
    stop_timeout: float,
    booting: bool = False,
) -> Observed:
    """Start the service, watch it run, SIGTERM its master while a report run has seconds
    of work left (*booting*: as soon as a worker opened its pool), and collect what
    happened."""
    seen = Observed(label, stop_timeout=stop_timeout)
    tag = uuid.uuid4().hex[:10]
    table, ledger, app_name = f"heartbeat_{tag}", f"runs_{tag}", f"cronlock-svc-{tag}"
    # Job names of this run alone: a name is its advisory lock's key on the whole database,
    # and another run of this test (another suite on the same server) would otherwise take
    # this one's locks, and the slots would be skipped on both.
    prefix = f"{tag}-"
    port = seen.port = free_port()
    env = {
        **os.environ,
        "DATABASE_DSN": pg_dsn,
        "HEARTBEAT_TABLE": table,
        "LEDGER_TABLE": ledger,
        "HEARTBEAT_SECONDS": str(HEARTBEAT.total_seconds()),
        "REPORT_CRON": "*/5 * * * * *",
        "REPORT_SECONDS": str(REPORT_SECONDS),
        "STOP_TIMEOUT": str(stop_timeout),
        "APPLICATION_NAME": app_name,
        "JOB_PREFIX": prefix,
        "PYTHONUNBUFFERED": "1",
        # Unclosed sockets, transports and connections would warn at exit: show them all.
        "PYTHONWARNINGS": "always::ResourceWarning",
        # gunicorn keeps a control socket under $HOME: keep it in the test's directory.
        "HOME": str(tmp_path),
    }
    out_path, err_path = tmp_path / f"{label}.out", tmp_path / f"{label}.err"

    def alive(proc: subprocess.Popen[bytes]) -> None:
        assert proc.poll() is None, f"{label} exited early: {err_path.read_text()[-3000:]}"

    with (
        out_path.open("w") as out,
        err_path.open("w") as err,
        subprocess.Popen(
            command(port, int(stop_timeout) + SERVER_GRACE_MARGIN),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        ) as proc,
    ):
        try:

            async def workers_up() -> set[int]:
                alive(proc)
                pids = {row[0] for row in await admin.fetch(WORKERS_SQL, f"{app_name}:app:%")}
                return pids if len(pids) == WORKERS else set()

            async def a_worker_booting() -> set[int]:
                alive(proc)
                return {row[0] for row in await admin.fetch(WORKERS_SQL, f"{app_name}:app:%")}

            if booting:
                seen.worker_pids = await eventually(
                    a_worker_booting, "a worker booting", STARTUP_BOUND, every=0.1
                )
            else:
                seen.worker_pids = await eventually(
                    workers_up, f"{WORKERS} workers up", STARTUP_BOUND, every=0.1
                )
                await watch_it_run(
                    seen, port, admin, table, app_name, prefix, alive=lambda: alive(proc)
                )

            seen.sigterm_at = await admin.fetchval("SELECT clock_timestamp()")
            stopping = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            bound = stop_timeout + EXIT_MARGIN
            try:
                seen.exit_status = await asyncio.to_thread(proc.wait, bound)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{label}: still running {bound:.0f}s after SIGTERM")
            seen.shutdown_seconds = time.monotonic() - stopping
        finally:
            # Whatever happened, nothing of the service outlives the test.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    async def sessions_gone() -> bool:
        left: int = await admin.fetchval(SESSIONS_SQL, f"{app_name}:%")
        return left == 0

    await eventually(sessions_gone, "the service's sessions closed", SESSIONS_BOUND, every=0.1)
    seen.sessions_left = await admin.fetchval(SESSIONS_SQL, f"{app_name}:%")

    async def rows_of(name: str, columns: str) -> list[dict[str, Any]]:
        # A service stopped while it boots may not have created its tables.
        if await admin.fetchval("SELECT to_regclass($1)", f'"{name}"') is None:
            return []
        return [dict(row) for row in await admin.fetch(f'SELECT {columns} FROM "{name}"')]

    # The checks name the jobs without this run's prefix.
    seen.rows = [
        {**row, "job": row["job"].removeprefix(prefix)}
        for row in await rows_of(table, "job, slot, pid, finished_at")
    ]
    seen.ledger = {
        (row["job"].removeprefix(prefix), row["slot"]): row
        for row in await rows_of(ledger, "job, slot, outcome, finished_at")
    }
    for name in (table, ledger, f"{ledger}_jobs"):
        await admin.execute(f'DROP TABLE IF EXISTS "{name}"')
    seen.stderr = err_path.read_text()
    return seen


def problems(stderr: str, port: int) -> list[str]:
    """The lines of *stderr* that show an unclean run or shutdown.

    Except one that is uvicorn's own: its supervisor never closes the listening socket it
    binds for its workers (``uvicorn.main.run``: ``config.bind_socket()``), so at exit the
    master process warns about that socket, on our port; nothing of the application's.
    (uvicorn 0.55 binds it with ``proto=6``, older releases with ``proto=0``.)
    """
    lines = stderr.splitlines()
    listening = re.compile(
        rf"sys:1: ResourceWarning: unclosed <socket\.socket fd=\d+, family=2, type=1, "
        rf"proto=\d+, laddr=\('127\.0\.0\.1', {port}\)>"
    )
    for i, line in enumerate(lines):
        if listening.fullmatch(line):
            del lines[i : i + 2 if lines[i + 1 : i + 2] == [TRACEMALLOC_HINT] else i + 1]
            break
    return [line for line in lines if any(bad in line for bad in BAD_STDERR)]


def slots_of(seen: Observed, job: str) -> list[datetime]:
    return sorted(row["slot"] for row in seen.rows if row["job"] == job)


def check_clean(seen: Observed) -> None:
    """What every shutdown must show, whatever happened to the run in flight."""
    # A clean exit: the servers' graceful status is 0.
    assert seen.exit_status == 0, seen.stderr[-3000:]
    assert problems(seen.stderr, seen.port) == []
    # The workers' sessions were there (the filter finds them), and none is left.
    assert seen.cronlock_sessions > 0
    assert seen.sessions_left == 0
    # Each slot ran once: none twice, none missing between the first and the last seen.
    for job, every in (("heartbeat", HEARTBEAT), ("report", REPORT)):
        slots = slots_of(seen, job)
        twice = sorted(slot for slot, n in Counter(slots).items() if n > 1)
        assert twice == [], f"{job}: slots run more than once: {twice}"
        expected = {slots[0] + k * every for k in range((slots[-1] - slots[0]) // every + 1)}
        missing = sorted(expected - set(slots))
        assert missing == [], f"{job}: slots missing between {slots[0]} and {slots[-1]}: {missing}"
    # The ledger has a run for each row of the example's table, and only those.
    assert {(row["job"], row["slot"]) for row in seen.rows} == set(seen.ledger)
    # Every run but the one in flight at SIGTERM finished, in both.
    flight = ("report", seen.in_flight["slot"])
    others = [row for row in seen.rows if (row["job"], row["slot"]) != flight]
    assert [row for row in others if row["finished_at"] is None] == []
    assert {seen.ledger[row["job"], row["slot"]]["outcome"] for row in others} == {"succeeded"}
    # Only the service's workers ran anything.
    assert {row["pid"] for row in seen.rows} <= seen.worker_pids


def report(seen: Observed, flight: str) -> None:
    beats = slots_of(seen, "heartbeat")
    runs = Counter(row["pid"] for row in seen.rows)
    print(
        f"\n[measured] {seen.label}: {WORKERS} workers {sorted(seen.worker_pids)}; "
        f"slots seen: heartbeat {len(beats)} ({beats[0]:%H:%M:%S}..{beats[-1]:%H:%M:%S}), "
        f"report {len(slots_of(seen, 'report'))}; duplicates 0, missing 0; "
        f"runs per worker {dict(sorted(runs.items()))}; "
        f"requests served by {len(seen.served_by)} worker(s); "
        f"report in flight at SIGTERM (slot {seen.in_flight['slot']:%H:%M:%S}, "
        f"pid {seen.in_flight['pid']}): {flight}; "
        f"shutdown {seen.shutdown_seconds:.2f}s (stop_timeout {seen.stop_timeout:g}s), "
        f"exit status {seen.exit_status}; cronlock sessions while running "
        f"{seen.cronlock_sessions}, sessions left {seen.sessions_left}"
    )


SERVERS = {"fastapi-uvicorn": uvicorn_command, "aiohttp-gunicorn": gunicorn_command}


@pytest.mark.parametrize("server", SERVERS)
async def test_each_slot_runs_once_and_sigterm_waits_for_the_run_in_flight(
    server: str, pg_dsn: str, admin: Any, tmp_path: Path
) -> None:
    seen = await exercise(server, SERVERS[server], pg_dsn, admin, tmp_path, stop_timeout=LONG_STOP)
    check_clean(seen)
    # The slow run in flight at SIGTERM was waited for, and finished after it.
    [row] = [r for r in seen.rows if r["job"] == "report" and r["slot"] == seen.in_flight["slot"]]
    assert row["finished_at"] is not None
    flight = seen.ledger["report", seen.in_flight["slot"]]
    assert flight["outcome"] == "succeeded"
    assert flight["finished_at"] > seen.sigterm_at
    report(seen, "waited for, succeeded")


@pytest.mark.parametrize("server", SERVERS)
async def test_a_run_past_stop_timeout_is_cancelled_and_the_exit_is_still_clean(
    server: str, pg_dsn: str, admin: Any, tmp_path: Path
) -> None:
    seen = await exercise(server, SERVERS[server], pg_dsn, admin, tmp_path, stop_timeout=SHORT_STOP)
    check_clean(seen)
    # The run had seconds of work left: stop_timeout ended it, and the ledger says so.
    [row] = [r for r in seen.rows if r["job"] == "report" and r["slot"] == seen.in_flight["slot"]]
    assert row["finished_at"] is None
    flight = seen.ledger["report", seen.in_flight["slot"]]
    assert flight["outcome"] == "cancelled"
    assert flight["finished_at"] > seen.sigterm_at
    assert "shutdown: cancelled 1 run(s) still going after 1.0s" in seen.stderr
    report(seen, "cancelled at stop_timeout, recorded cancelled")


@pytest.mark.parametrize("server", SERVERS)
async def test_a_service_stopped_while_it_boots_exits_cleanly(
    server: str, pg_dsn: str, admin: Any, tmp_path: Path
) -> None:
    # SIGTERM as soon as a worker opened its pool: workers stop while their schedulers start
    # (a deploy rolled back, Ctrl-C right after starting it).
    seen = await exercise(
        server, SERVERS[server], pg_dsn, admin, tmp_path, stop_timeout=LONG_STOP, booting=True
    )
    assert seen.exit_status == 0, seen.stderr[-3000:]
    assert problems(seen.stderr, seen.port) == []
    assert seen.sessions_left == 0
    # Every scheduler that started was shut down.
    started = seen.stderr.count("INFO cronlock: scheduler started")
    assert seen.stderr.count("INFO cronlock: scheduler stopped") == started
    # Whatever ran before the stop ran once and finished.
    slots = [(row["job"], row["slot"]) for row in seen.rows]
    assert len(slots) == len(set(slots))
    assert [row for row in seen.rows if row["finished_at"] is None] == []
    assert {entry["outcome"] for entry in seen.ledger.values()} <= {"succeeded"}
    print(
        f"\n[measured] {seen.label} stopped while booting: {started} scheduler(s) started "
        f"and stopped, {len(slots)} run(s); shutdown {seen.shutdown_seconds:.2f}s, "
        f"exit status {seen.exit_status}, sessions left {seen.sessions_left}"
    )
