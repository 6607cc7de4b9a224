"""The database restarts, or is down a while, and the service notices no more than a log line.

Every test here uses a throwaway cluster of its own (``restartable_pg``, see cluster.py),
never the machine's shared server: the tests stop it, restart it fast (sessions
terminated) and immediately (a crash, then recovery). They check that

- runs in flight end with ``LockLost`` (outcome ``lock_lost`` in the ledger), the
  schedulers go on, and once the server is back each slot runs exactly once again;
- while the server is down, the lock sessions try to reconnect a number of times bounded
  by their backoff, however many jobs are due, and the outage is logged once;
- the elector retries once per poll interval, no faster;
- a test run killed with SIGKILL leaves no cluster running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from cronlock import (
    Event,
    JobStarted,
    JobSucceeded,
    LockFailed,
    LockLost,
    Scheduler,
    SystemClock,
    every,
)
from cronlock.postgres import PostgresElector, PostgresLocker
from cronlock.postgres._conn.backoff import RECONNECT_JITTER, RECONNECT_MAX, backoff_step

from ..eventually import eventually, eventually_blocking
from .cluster import Cluster, Mode, postmaster_pid, sweep
from .events import Events
from .proxy import TcpProxy, via
from .replica import command as replica_command
from .replica import drawn

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

Record = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]


def most_attempts(seconds: float) -> int:
    """The most connects one lock session can try during *seconds* of outage.

    The first at once, then one after each wait, and each wait is at least
    ``1 - RECONNECT_JITTER`` of its step of the backoff schedule.
    """
    attempts, elapsed = 1, 0.0
    while True:
        elapsed += backoff_step(attempts) * (1 - RECONNECT_JITTER)
        if elapsed > seconds:
            return attempts
        attempts += 1


def first_slot_in(seconds: float) -> float:
    return float(math.ceil(time.time() + seconds))


# -- replica processes ---------------------------------------------------------------------


class Replicas:
    """replica.py processes writing their JSON lines to files (a full pipe would stall them)."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._procs: list[tuple[subprocess.Popen[str], Path]] = []

    def spawn(
        self, dsn: str, job: str, rid: int, start: float | None, slots: int, *extra: str
    ) -> None:
        """Start a replica; *start* ``None``: it waits, booted, for :meth:`begin`."""
        out = self._tmp / f"replica-{rid}-{len(self._procs)}.jsonl"
        with out.open("w") as sink:
            proc = subprocess.Popen(
                replica_command(dsn, job, rid, start, slots, *extra),
                stdin=subprocess.PIPE if start is None else subprocess.DEVNULL,
                stdout=sink,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._procs.append((proc, out))

    async def begin(self, start: Callable[[], float]) -> float:
        """Once every replica spawned without a start has booted (imported what it runs),
        tell them all the first slot, ``start()`` (asked then), and return it."""
        waiting = [proc for proc, _ in self._procs if proc.stdin is not None]
        await eventually(
            lambda: sum(r["event"] == "booted" for r in self.lines()) >= len(waiting),
            "the replicas booted",
            120,
        )
        first = start()
        for proc in waiting:
            assert proc.stdin is not None
            proc.stdin.write(f"{first}\n")
            proc.stdin.close()
        return first

    def lines(self) -> list[Record]:
        """What the replicas printed so far."""
        found: list[Record] = []
        for _, out in self._procs:
            for line in out.read_text().splitlines():
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue  # a line being written
        return found

    async def finished(self, timeout: float = 300) -> list[Record]:
        """Wait for every replica to exit; they must exit cleanly."""
        for proc, out in self._procs:
            await asyncio.to_thread(proc.wait, timeout)
            assert proc.returncode == 0, out.read_text()[-2000:]
        return self.lines()

    def kill(self) -> None:
        for proc, _ in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    fleet = Replicas(tmp_path)
    try:
        yield fleet
    finally:
        fleet.kill()


def busy_slots(records: list[Record]) -> set[float]:
    """Slots nobody ran because a run of the job held its lock when each replica asked.

    An answer ``"locked"`` is explained when some lease's window (from its acquire call to
    its release's return, on the real clock) overlaps the window of that acquire call; an
    overlap skip means the replica itself was running the job.
    """
    granted = {
        (r["replica"], r["slot"]): r["t0"]
        for r in records
        if r["event"] == "attempt" and r["result"] == "granted"
    }
    released = {(r["replica"], r["slot"]): r["t"] for r in records if r["event"] == "released"}
    windows = [(t0, released.get(key, math.inf)) for key, t0 in granted.items()]
    busy: set[float] = set()
    for r in records:
        if r["event"] == "attempt" and r["result"] == "locked":
            if any(start <= r["t1"] and r["t0"] <= end for start, end in windows):
                busy.add(r["slot"])
        elif r["event"] == "skipped" and r["reason"] == "overlap":
            busy.add(r["slot"])
    return busy


async def ledger_outcomes(dsn: str, jobs: list[str]) -> dict[tuple[str, float], str | None]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT job, slot, outcome FROM cronlock_runs WHERE job = ANY($1::text[])", jobs
        )
    finally:
        await conn.close()
    return {(row["job"], row["slot"].timestamp()): row["outcome"] for row in rows}


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_runs_go_on_through_a_server_restart(
    mode: Mode, restartable_pg: Cluster, replicas: Replicas, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas, a job every second whose runs take 0.5 to 2 s; the server restarts
    while one of them runs."""
    cluster = restartable_pg
    # Three slots before the restart, the restart, RECONNECT_MAX + 1 s, at least eight
    # slots, and ten to spare on a busy machine (beside two CPU hogs a restart -m
    # immediate took over 5 s, and four to spare left seven slots after recovery).
    slots = 3 + 1 + math.ceil(RECONNECT_MAX + 1) + 8 + 10
    job = f"restart-{mode}-{uuid.uuid4().hex[:8]}"
    hold = (0.5, 2.0)
    for rid in (1, 2):
        extra = ["--interval", "1", "--hold-range", *map(str, hold), "--trace"]
        replicas.spawn(cluster.dsn, job, rid, None, slots, *extra)

    def lasts(slot: float) -> float:
        return drawn(datetime.fromtimestamp(slot, UTC), *hold)

    def first_slot() -> float:
        """The first slot in 2 s or later whose 4th slot's run takes 1.2 s or more."""
        start = first_slot_in(2)
        while lasts(start + 3) < 1.2:
            start += 1
        return start

    start = await replicas.begin(first_slot)

    # Restart while a run is in flight that surely outlasts the restart's first moments.
    def in_flight_now() -> list[Record]:
        return [
            r
            for r in replicas.lines()
            if r["event"] == "start" and r["slot"] >= start + 3 and lasts(r["slot"]) >= 1.2
        ]

    started = await eventually(in_flight_now, "a long run in flight", 120, every=0.02)
    in_flight = started[0]["slot"]
    down = time.time()
    await asyncio.to_thread(cluster.restart, mode)
    back = time.time()
    records = await replicas.finished()

    runs: dict[float, int] = {}
    for r in records:
        if r["event"] == "start":
            runs[r["slot"]] = runs.get(r["slot"], 0) + 1
    lost = [r for r in records if r["event"] == "lock_lost"]
    failed = [r for r in records if r["event"] == "lock_failed"]
    exits = [r for r in records if r["event"] == "exit"]
    outcomes = await ledger_outcomes(cluster.dsn, [job])
    # Once the backoff wait in progress when the server came back is over (at most
    # RECONNECT_MAX), the next slot must run.
    recovered = math.ceil(back + RECONNECT_MAX + 1)
    after = [start + k for k in range(slots) if start + k >= recovered]
    busy = busy_slots(records)
    first_run = min(
        (r["t"] for r in records if r["event"] == "start" and r["t"] >= back), default=math.nan
    )
    ran_after = [s for s in after if runs.get(s) == 1]
    with capsys.disabled():
        print(
            f"\n[measured] restart -m {mode}: server down {back - down:.1f}s; runs ended "
            f"LockLost: {len(lost)}; lock failures while down: {len(failed)}; first run "
            f"{first_run - back:.2f}s after the server was back; connect attempts per "
            f"replica: {[r['connect_attempts'] for r in exits]}; slots after recovery: "
            f"{len(after)}: ran once {len(ran_after)}, not run while a run held the lock "
            f"{len(set(after) & busy - set(ran_after))}"
        )
    assert len(exits) == 2  # both schedulers went on to the end
    assert all(n == 1 for n in runs.values()), runs  # never a slot twice, restart or not
    # The run in flight lost its lock and ended so; its outcome reached the ledger late.
    assert in_flight in {r["slot"] for r in lost}
    assert outcomes[(job, in_flight)] == "lock_lost"
    # After recovery: every slot ran exactly once (and succeeded), or a run held the lock.
    # (Eight slots or more are left unless the restart itself was slow: beside two CPU
    # hogs, pg_ctl's restart -m immediate took up to 12 s. Three are enough to check.)
    assert len(after) >= 3
    assert [s for s in after if runs.get(s) != 1 and s not in busy] == []
    assert [outcomes.get((job, s)) for s in ran_after] == ["succeeded"] * len(ran_after)
    assert [r for r in failed if r["slot"] >= recovered] == []
    assert ran_after


# -- one scheduler, fifty jobs, a server down for ten seconds ------------------------------

JOBS = 50
SESSIONS = 4
OUTAGE = 10.0


async def until(events: Events, done: Callable[[], bool], what: str) -> None:
    await eventually(done, what, 90)


async def test_a_server_down_for_ten_seconds_costs_few_connect_attempts(
    restartable_pg: Cluster, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = restartable_pg
    # The proxy only counts connections, an outside witness of the locker's own counter.
    proxy = TcpProxy("127.0.0.1", cluster.port)
    await proxy.start()
    locker = PostgresLocker(
        via(cluster.dsn, proxy.port),
        sessions=SESSIONS,
        application_name=f"cronlock-test-outage-{uuid.uuid4().hex[:8]}",
    )
    scheduler = Scheduler(clock=SystemClock(), locker=locker)
    events = Events()
    scheduler.subscribe(events)
    started_at: list[tuple[float, JobStarted]] = []

    def note_start(event: Event) -> None:
        if isinstance(event, JobStarted):
            started_at.append((time.time(), event))

    scheduler.subscribe(note_start)
    names = [f"outage-{uuid.uuid4().hex[:8]}-{i}" for i in range(JOBS)]

    async def work() -> None:
        await asyncio.sleep(0.6)

    for name in names:
        scheduler.add_job(work, every(1), name=name)

    def succeeded_since(t: float) -> set[str]:
        return {e.job for e in events.of(JobSucceeded) if e.slot.timestamp() >= t}

    loop = asyncio.get_running_loop()
    try:
        with caplog.at_level(logging.INFO, logger="cronlock"):
            async with locker, scheduler:
                await until(events, lambda: len(succeeded_since(0)) == JOBS, "every job ran")
                # Stop the server while runs are in flight (they all start together).
                starts = events.count(JobStarted)
                await until(events, lambda: events.count(JobStarted) > starts, "runs in flight")
                before, accepted = locker.statistics(), proxy.accepted
                seen, logged = len(events.items), len(caplog.records)
                down_at = loop.time()
                await asyncio.to_thread(cluster.stop, "fast")
                await asyncio.sleep(OUTAGE)
                await asyncio.to_thread(cluster.start)
                outage = loop.time() - down_at
                back = time.time()
                during = locker.statistics()
                witnessed = proxy.accepted - accepted
                outage_events = events.items[seen:]
                outage_logs = caplog.records[logged:]
                # Once the wait in progress when the server came back is over, every job
                # runs again: three slots in a row for each.
                recovered = math.ceil(back + RECONNECT_MAX + 1)
                await until(
                    events,
                    lambda: len(succeeded_since(recovered + 2)) == JOBS,
                    "every job's slots ran again",
                )
                assert scheduler.running
    finally:
        await proxy.close()
    outcomes = await ledger_outcomes(cluster.dsn, names)
    attempts = during.connect_attempts - before.connect_attempts
    bound = SESSIONS * (most_attempts(outage) + 1)  # +1: the attempt that found it back
    lock_failed = sum(isinstance(e, LockFailed) for e in outage_events)
    lock_lost = sum(isinstance(e, LockLost) for e in outage_events)
    errors = [r for r in outage_logs if r.levelno >= logging.ERROR]
    first_run = min((t for t, _ in started_at if t >= back), default=math.nan) - back
    with capsys.disabled():
        print(
            f"\n[measured] server down {outage:.1f}s under {JOBS} jobs a second: "
            f"{attempts} connect attempts by {SESSIONS} sessions (backoff bound {bound}; "
            f"{witnessed} TCP connections seen by a proxy), {lock_failed} runs skipped "
            f"(LockFailed), {lock_lost} runs ended LockLost, {len(errors)} ERROR log lines; "
            f"first run {first_run:.2f}s after the server was back"
        )
    assert attempts <= bound
    # asyncpg's sslmode=prefer may open a second TCP connection for one attempt.
    assert witnessed <= 2 * bound
    # Without the backoff, every skipped run would have been an attempt.
    assert lock_failed >= 3 * bound
    assert lock_lost >= 1
    # One ERROR per session for the outage, one per session for the locks it lost, and
    # one per run that lost its lock: not one per skipped run.
    assert len(errors) <= 2 * SESSIONS + lock_lost, [r.getMessage() for r in errors][:10]
    assert any("reconnected after" in r.getMessage() for r in outage_logs + caplog.records)
    # After recovery every job's slots ran, each once (the ledger's key) and succeeded.
    for name in names:
        assert [outcomes.get((name, float(s))) for s in range(recovered, recovered + 3)] == [
            "succeeded"
        ] * 3


async def test_the_elector_retries_once_per_poll_while_the_server_is_down(
    restartable_pg: Cluster, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = restartable_pg
    proxy = TcpProxy("127.0.0.1", cluster.port)
    await proxy.start()
    poll = 0.5
    elector = PostgresElector(
        via(cluster.dsn, proxy.port), name=f"restart-{uuid.uuid4().hex[:8]}", poll_interval=poll
    )
    loop = asyncio.get_running_loop()
    try:
        with caplog.at_level(logging.DEBUG, logger="cronlock.election"):
            async with elector:
                await eventually(lambda: elector.is_leader_now, "the elector leading", 60)
                accepted, logged = proxy.accepted, len(caplog.records)
                down_at = loop.time()
                await asyncio.to_thread(cluster.stop, "fast")
                await asyncio.sleep(4)
                await asyncio.to_thread(cluster.start)
                outage = loop.time() - down_at
                witnessed = proxy.accepted - accepted
                outage_logs = caplog.records[logged:]
                await eventually(lambda: elector.is_leader_now, "the elector leading", 60)
    finally:
        await proxy.close()
    retries = [r for r in outage_logs if "retrying" in r.getMessage()]
    with capsys.disabled():
        print(
            f"\n[measured] elector, server down {outage:.1f}s, poll {poll}s: {len(retries)} "
            f"failed sessions, {witnessed} TCP connections; leader again (term "
            f"{elector.terms})"
        )
    # One attempt per poll interval (each failure sleeps a poll), plus the one that
    # found the server back; asyncpg may open two TCP connections per attempt.
    assert len(retries) <= outage / poll + 1
    assert witnessed <= 2 * (outage / poll + 2)
    assert [r.levelname for r in retries].count("WARNING") == 1  # the rest at DEBUG
    assert elector.terms == 2


# -- the throwaway cluster never outlives the test run -----------------------------------

PROBE = """
import os
import time

from tests.postgres.cluster import Cluster


def test_hold_a_cluster_until_killed(restartable_pg: Cluster) -> None:
    with open(os.environ["CRONLOCK_PROBE_OUT"], "w") as out:
        out.write(f"{restartable_pg.postmaster_pid} {restartable_pg.root}\\n")
    time.sleep(120)  # the test that runs this kills it long before
"""


def gone_within(seconds: float, pid: int, root: str) -> float:
    """Seconds until the postmaster *pid* exited and *root* was removed; the test fails if
    that takes more than *seconds*."""
    began = time.monotonic()
    eventually_blocking(
        lambda: postmaster_pid(os.path.join(root, "data")) != pid and not os.path.exists(root),
        f"postmaster {pid} of {root} stopped and its directory removed",
        seconds,
    )
    return time.monotonic() - began


def wait_for_line(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    def line() -> str | None:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return text
        assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
        return None

    return eventually_blocking(line, f"a line in {path}", timeout)


def test_a_test_run_killed_with_sigkill_leaves_no_cluster_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "probe.out"
    # pytest on the probe alone, with this directory's fixtures loaded as a plugin.
    plugins = ["-p", "tests.postgres.conftest", "-p", "no:cacheprovider"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *plugins, "-q", "--rootdir", str(tmp_path), str(probe)],
        cwd=REPO,
        env={**os.environ, "CRONLOCK_PROBE_OUT": str(out)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        pid_text, root = wait_for_line(out, proc).split()
        pid = int(pid_text)
        assert postmaster_pid(os.path.join(root, "data")) == pid
    finally:
        proc.send_signal(signal.SIGKILL)  # no finalizer runs
        proc.communicate()
    gone = gone_within(20, pid, root)  # fails the test if it outlives the killed run
    with capsys.disabled():
        print(f"\n[measured] pytest SIGKILLed: its cluster was gone {gone:.1f}s later")


def test_a_cluster_whose_owner_died_without_its_watchdog_is_swept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_WITHOUT_WATCHDOG],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        try:
            assert owner.stdout is not None
            pid_text, root = owner.stdout.readline().split()
            pid = int(pid_text)
        finally:
            owner.kill()
            owner.communicate()
        # Nobody stops it: a dead owner without a watchdog leaks its cluster...
        assert postmaster_pid(os.path.join(root, "data")) == pid
        # ...until the next test run sweeps it.
        assert root in sweep()
        gone_within(5, pid, root)
    finally:
        sweep()  # whatever failed above, leave nothing running


OWNER_WITHOUT_WATCHDOG = """
import time
from tests.postgres.cluster import Cluster
cluster = Cluster(watchdog=False)
cluster.start()
print(cluster.postmaster_pid, cluster.root, flush=True)
time.sleep(120)
"""
