"""Failover: a primary lost and a standby promoted, under three replicas, one table in one run.

    python benchmarks/failover.py                          # every row, both modes (~12 min)
    python benchmarks/failover.py --rows lagging --modes lease --seconds-after 40

Per row a fresh throwaway primary and a streaming standby of it (tests/postgres/cluster.py:
``initdb``, then ``pg_basebackup -R``; never the machine's shared server), asynchronous
replication unless the row says otherwise, and three replica processes
(failover_replica.py: ten jobs every second, ``misfire_grace`` 30 s, cronlock's defaults,
20 s lease in lease mode) given the multi-host DSN
``postgresql://postgres@127.0.0.1:<primary>,127.0.0.1:<standby>/postgres?target_session_attrs=read-write``.
The standby streams as ``application_name=failover_standby``. After a warm-up, one fault:

- ``crash-async``: the primary crashes (``pg_ctl stop -m immediate``); the standby is
  promoted 3 s later (``pg_ctl promote``);
- ``crash-sync``: the same, the primary's ``synchronous_standby_names`` naming the standby
  (``synchronous_commit`` on, the default): every commit waited for the standby's flush;
- ``switchover``: planned: the primary stopped with ``-m fast`` (it sends the standby all
  its WAL before it exits), the standby promoted at once;
- ``lagging``: the standby's ``primary_conninfo`` goes through a TCP proxy
  (failover_proxy.py) that falls silent 3 s before the crash: the standby *receives*
  nothing of the last 3 s (apply delay alone, ``recovery_min_apply_delay``, would lose
  nothing: promotion applies all WAL received). Then as ``crash-async``;
- ``dropping``: the DSN's first host is a TCP proxy in front of the primary; at the fault
  the proxy falls silent (every byte dropped, new connections accepted and never answered,
  no reset passed on) and the primary crashes behind it: a dead primary that drops packets
  instead of refusing connections. The standby is promoted 3 s later.

The new primary takes writes at the first ``SELECT pg_current_xact_id()`` that succeeds on
it (polled every 20 ms). The replicas run ``--seconds-after`` more seconds, then are
stopped (SIGTERM). Judged, from the replicas' effects files, their logs and the new
primary's ``cronlock_runs``, over every slot of every job from the end of the warm-up to
1.5 s before the stop:

- **duplicates**: slots with two finished runs (``end`` lines);
- **slots never run**, due *during the outage* (from the fault to the new primary taking
  writes) or *after it*, with the last answer a replica got for each (a skip's reason, or
  the failed claim's error). Excused, and counted apart: a slot *coalesced* (its claim
  failed for want of the server, or it fell due while the job's claim or release hung on
  a silent server and no replica said a word of it, and so did the job's later slots up
  to its next run: slots owed across an outage coalesce into the latest, which the job's
  next run covers, by design) and a slot whose job was *busy* (a run of it in progress,
  on any replica, when the slot was claimed);
- **first run** after the fault and after the new primary took writes (the first ``start``
  line of a slot due after the fault), and the **slowest replica back**: how long after
  the new primary took writes each replica had its first answer from it (a run, or a
  ``locked``/``already_ran`` refusal); a wedged replica never has one;
- **log records at WARNING or above** per replica, from 1 s before the incident (the
  silenced link of ``lagging`` included) to the stop, and **tracebacks** in the whole log;
- **ledger rows missing** on the new primary: runs that started but have no row (lost
  claims), and runs that finished but whose row has no end (lost outcomes);
- **standby behind**: the fault's instant minus the time of the last transaction the
  standby had replayed when it was promoted.

Prints a Markdown table, writes benchmarks/results/failover.json; effects files and logs
stay in benchmarks/results/failover-logs/<row>-<mode>/ until the next run of the row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import asyncpg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LOGS = RESULTS / "failover-logs"
REPLICA = HERE / "failover_replica.py"
sys.path.insert(0, str(ROOT / "tests" / "postgres"))
sys.path.insert(0, str(HERE))

from cluster import Cluster  # noqa: E402
from failover_proxy import SilentProxy  # noqa: E402
from failover_replica import INTERVAL, JOBS, MISFIRE_GRACE  # noqa: E402
from pgbouncer import PgBouncer, pgbouncer_binary  # noqa: E402

FAULTS = {
    "crash-async": "primary crash, async replication",
    "crash-sync": "primary crash, sync replication",
    "switchover": "planned switchover",
    "lagging": "lagging standby (3 s of WAL never received)",
    "dropping": "crash, dead primary drops packets",
    "pgbouncer": "primary crash, async, via PgBouncer (VIP moved)",
}
ONLY_MODES = {"pgbouncer": ("lease",)}
"""Rows that exist in some modes only: session mode refuses a transaction pooler."""
MODES = ("session", "lease")
REPLICAS = 3
STANDBY_NAME = "failover_standby"
WARMUP = 5.0
"""Seconds from the last replica ready to the first judged slot."""
LEAD = 5.3
"""Seconds of judged slots before the fault (the fault falls mid-interval, runs in flight)."""
PROMOTE_AFTER = 3.0
"""Seconds from a crash to the promotion."""
LAG = 3.0
"""Seconds of WAL the lagging standby never receives."""
LOGIN_RETRY = 2
"""PgBouncer's ``server_login_retry`` in the PgBouncer row."""
TAIL = 1.5
"""The last judged slot is due this long before the replicas are told to stop."""
UNREACHABLE = ("LockUnavailable", "SessionLost", "StatementTimeout")
"""A claim that failed with one of these never reached a server: its slot is owed."""
BUSY_BEFORE, BUSY_AFTER = 0.3, 0.5
"""A slot meets its job busy if a run of it was in progress from this long before the slot
(claims go out 0.1 s early) to this long after it."""
RECORD = re.compile(r"^(\d+\.\d{3}) r\d+ ([A-Z]+) ")
SERIOUS = ("WARNING", "ERROR", "CRITICAL")
ANSWERS = ("locked", "already_ran")
"""Refusals that only a server that took the claim can give."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def sleep_until(epoch: float) -> None:
    while (left := epoch - time.time()) > 0:
        await asyncio.sleep(min(left, 0.5))


# -- the pair of servers ----------------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    """A primary and its streaming standby, and the proxies a row puts between them."""

    primary: Cluster
    standby: Cluster
    front: SilentProxy | None  # the DSN's first host, in front of the primary (dropping)
    link: SilentProxy | None  # the standby's replication connection (lagging)
    vip: SilentProxy | None = None  # PgBouncer's way to the primary, moved at promotion
    bouncer: PgBouncer | None = None

    @property
    def dsn(self) -> str:
        if self.bouncer is not None:
            return self.bouncer.dsn
        first = self.front.port if self.front is not None else self.primary.port
        return (
            f"postgresql://postgres@127.0.0.1:{first},127.0.0.1:{self.standby.port}"
            "/postgres?target_session_attrs=read-write"
        )


async def make_pair(fault: str, stack: contextlib.AsyncExitStack) -> Pair:
    """A fresh primary and standby for *fault*, streaming; destroyed when *stack* closes."""
    primary = Cluster()
    stack.callback(primary.destroy)  # and its standby
    await asyncio.to_thread(primary.start)
    standby = await asyncio.to_thread(primary.standby)
    front = link = None
    if fault == "dropping":
        front = SilentProxy("127.0.0.1", primary.port)
        stack.push_async_callback(front.close)
        await front.start()
    port = primary.port
    if fault == "lagging":
        link = SilentProxy("127.0.0.1", primary.port)
        stack.push_async_callback(link.close)
        port = await link.start()
    # Named, so that the primary can wait for it; through the link when there is one. A
    # reload restarts the WAL receiver with the new conninfo (PostgreSQL 13 and later).
    conninfo = f"host=127.0.0.1 port={port} user=postgres application_name={STANDBY_NAME}"
    await execute(standby.dsn, f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'")
    if fault == "crash-sync":
        # On the primary only (after the base backup was taken): the promoted standby
        # must not wait for a standby of its own.
        await execute(primary.dsn, f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
    await wait_streaming(primary.dsn, sync=fault == "crash-sync")
    pair = Pair(primary, standby, front, link)
    if fault == "pgbouncer":
        pair.vip = SilentProxy("127.0.0.1", primary.port)
        stack.push_async_callback(pair.vip.close)
        await pair.vip.start()
        # server_login_retry 2 s, not 15 (as the soak: docs/soak.md): after the crash,
        # a failed login must not keep PgBouncer from the new primary for 15 s.
        pair.bouncer = PgBouncer(
            "127.0.0.1", pair.vip.port, settings={"server_login_retry": str(LOGIN_RETRY)}
        )
        stack.callback(pair.bouncer.stop)
        await asyncio.to_thread(pair.bouncer.start)
    return pair


async def execute(dsn: str, statement: str) -> None:
    """*statement*, then a configuration reload, on the server of *dsn*."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def wait_streaming(dsn: str, *, sync: bool, timeout: float = 30.0) -> None:
    """Until the primary of *dsn* streams to the standby (synchronously if *sync*)."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.time() + timeout
        while True:
            state = await conn.fetchrow(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
                STANDBY_NAME,
            )
            streaming = state is not None and state["state"] == "streaming"
            if streaming and (not sync or state["sync_state"] == "sync"):
                return
            if time.time() > deadline:
                raise RuntimeError(f"the standby did not stream within {timeout:g}s: {state}")
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def wait_writable(dsn: str, timeout: float = 60.0) -> float:
    """The time the server of *dsn* first assigns a transaction id: it takes writes."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                await conn.fetchval("SELECT pg_current_xact_id()")
            except asyncpg.PostgresError:  # "cannot assign TransactionIds during recovery"
                await asyncio.sleep(0.02)
                continue
            return time.time()
        raise RuntimeError(f"the promoted standby took no write within {timeout:g}s")
    finally:
        await conn.close()


async def replay_lag(dsn: str, at: float) -> float | None:
    """Seconds from the last transaction the standby of *dsn* replayed to *at*."""
    conn = await asyncpg.connect(dsn)
    try:
        last = await conn.fetchval("SELECT extract(epoch FROM pg_last_xact_replay_timestamp())")
    finally:
        await conn.close()
    return None if last is None else at - float(last)


async def read_ledger(dsn: str) -> dict[tuple[str, float], dict[str, Any]]:
    """The new primary's ``cronlock_runs``, by (job, slot as epoch seconds)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT job, extract(epoch FROM slot)::float8 AS slot, outcome, "
            "finished_at IS NOT NULL AS finished, holder FROM cronlock_runs"
        )
    finally:
        await conn.close()
    return {(r["job"], round(r["slot"], 3)): dict(r) for r in rows}


async def dump_ledger(dsn: str, path: Path) -> None:
    """The new primary's runs and leases tables, as JSON, for the post-mortem."""
    conn = await asyncpg.connect(dsn)
    try:
        tables = {}
        for table in ("cronlock_runs", "cronlock_runs_leases"):
            with contextlib.suppress(asyncpg.UndefinedTableError):
                rows = await conn.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")
                tables[table] = [dict(r) for r in rows]
    finally:
        await conn.close()
    path.write_text(json.dumps(tables, indent=1, default=str) + "\n")


# -- the replicas -----------------------------------------------------------------------------


class Replica:
    """One replica process; its effects file and log outlive it."""

    def __init__(self, index: int, directory: Path) -> None:
        self.index = index
        self.effects = directory / f"effects-{index}.jsonl"
        self.log = directory / f"replica-{index}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.stop_seconds: float | None = None
        self.exit_code: int | None = None

    async def start(self, dsn: str, mode: str) -> None:
        with open(self.log, "ab") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, str(REPLICA),
                "--dsn", dsn, "--mode", mode, "--id", str(self.index),
                "--effects", str(self.effects),
                stdin=subprocess.PIPE,  # its end: the driver is gone, the replica stops
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,  # a Ctrl-C is the driver's to handle
            )  # fmt: skip
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"replica {self.index} did not start: {line!r} (see {self.log})")

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within *timeout* seconds."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        began = time.time()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout)
            self.stop_seconds = time.time() - began
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        self.exit_code = process.returncode


# -- judging ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Times:
    """The instants of one row (true wall time, epoch seconds)."""

    judge_from: float
    incident: float  # the first act of the fault (the lagging row: the link falls silent)
    fault: float
    writable: float
    stop: float

    @property
    def judge_to(self) -> float:
        return self.stop - TAIL


@dataclasses.dataclass
class Run:
    replica: int
    start: float
    end: float | None = None
    cancelled: bool = False


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                yield json.loads(line)  # a torn last line (a killed process) is skipped


def runs_of(records: Iterable[dict[str, Any]]) -> dict[tuple[str, float], list[Run]]:
    """Every run, by (job, slot), from the effects files' start/end/cancel lines."""
    runs: dict[tuple[str, float], list[Run]] = {}
    by_process: dict[tuple[str, float, int], Run] = {}
    for rec in records:
        key = (rec["job"], round(rec["slot"], 3))
        if rec["e"] == "start":
            run = Run(rec["rep"], rec["t"])
            runs.setdefault(key, []).append(run)
            by_process[(*key, rec["pid"])] = run
        elif rec["e"] in ("end", "cancel") and (ended := by_process.get((*key, rec["pid"]))):
            ended.end = rec["t"]
            ended.cancelled = rec["e"] == "cancel"
    return runs


def missed_slot(
    job: str,
    slot: float,
    runs: dict[tuple[str, float], list[Run]],
    slots: list[float],
    owed: set[tuple[str, float]],
    answered: Collection[tuple[str, float]] = (),
) -> str:
    """Why *slot* of *job* has no run: ``coalesced`` (its claim failed for want of the
    server, or no replica said anything of it (*answered* lacks it: it fell due while the
    job's claim or release hung on the silent server, and was owed without a word), so it
    was owed, and so was every later slot of the job up to the job's next run: owed slots
    coalesce into the latest, and the latest into the next run, by design), ``busy`` (a
    run of the job was in progress, on any replica, when the slot was claimed), else
    ``missed``."""
    if (job, slot) in owed or (job, slot) not in answered:
        for other in slots:
            if other <= slot:
                continue
            if runs.get((job, other)):
                return "coalesced"
            if (job, other) not in owed and (job, other) in answered:
                break  # a slot in between neither ran nor was owed: nothing covers this one
    for (name, _), got in runs.items():
        if name != job:
            continue
        for run in got:
            end = run.end if run.end is not None else run.start + 1.0
            if run.start <= slot + BUSY_AFTER and end >= slot - BUSY_BEFORE:
                return "busy"
    return "missed"


def last_answers(records: Iterable[dict[str, Any]]) -> dict[tuple[str, float], str]:
    """The last thing any replica was told of each (job, slot) it did not run: a skip's
    reason (``locked``, ``already_ran``, ``overlap``, ``misfire``...) or ``failed:<error>``."""
    last: dict[tuple[str, float], tuple[float, str]] = {}
    for rec in records:
        if rec["e"] not in ("skip", "failed"):
            continue
        key = (rec["job"], round(rec["slot"], 3))
        said = rec["reason"] if rec["e"] == "skip" else f"failed:{rec['why']}"
        if key not in last or rec["t"] >= last[key][0]:
            last[key] = (rec["t"], said)
    return {key: said for key, (_, said) in last.items()}


def count(items: Iterable[str]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for item in items:
        counted[item] = counted.get(item, 0) + 1
    return dict(sorted(counted.items(), key=lambda kv: -kv[1]))


def read_log(path: Path, since: float, until: float) -> tuple[list[str], int]:
    """(records at WARNING or above between *since* and *until*, tracebacks in the log)."""
    serious: list[str] = []
    text = ""
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        text = f.read()
    for line in text.splitlines():
        match = RECORD.match(line)
        if match and match[2] in SERIOUS and since <= float(match[1]) <= until:
            serious.append(line[:400])
    # A chained exception prints one traceback per link: a record's count once.
    chained = text.count("The above exception was the direct cause") + text.count(
        "During handling of the above exception"
    )
    return serious, text.count("Traceback (most recent call last)") - chained


def judge(
    times: Times,
    replicas: list[Replica],
    ledger: dict[tuple[str, float], dict[str, Any]],
) -> dict[str, Any]:
    records = [rec for r in replicas for rec in read_jsonl(r.effects)]
    runs = runs_of(records)
    first = math.ceil(times.judge_from / INTERVAL) * INTERVAL
    slots = [first + k * INTERVAL for k in range(int((times.judge_to - first) // INTERVAL) + 1)]
    slots = [round(s, 3) for s in slots]
    jobs = [name for name, _ in JOBS]
    duplicates = started_twice = 0
    missed: dict[str, dict[str, int]] = {
        phase: {"missed": 0, "coalesced": 0, "busy": 0} for phase in ("before", "during", "after")
    }
    missed_slots: list[tuple[str, float, str, str, str]] = []
    answers = last_answers(records)
    owed = {
        (rec["job"], round(rec["slot"], 3))
        for rec in records
        if rec["e"] == "failed" and rec["why"] in UNREACHABLE
    }
    for job in jobs:
        for slot in slots:
            got = runs.get((job, slot), [])
            started_twice += len(got) > 1
            duplicates += sum(r.end is not None and not r.cancelled for r in got) > 1
            if got:
                continue
            phase = (
                "before" if slot < times.fault else "during" if slot < times.writable else "after"
            )
            why = missed_slot(job, slot, runs, slots, owed, answers)
            missed[phase][why] += 1
            missed_slots.append((job, slot, phase, why, answers.get((job, slot), "none")))
    misfired = {
        (rec["job"], round(rec["slot"], 3))
        for rec in records
        if rec["e"] == "skip" and rec.get("reason") == "misfire"
    }
    starts = sorted(
        (run.start, slot) for (_, slot), got in runs.items() for run in got if slot > times.fault
    )
    first_after_fault = starts[0][0] - times.fault if starts else None
    after_writable = [t for t, _ in starts if t >= times.writable]
    first_after_writable = after_writable[0] - times.writable if after_writable else None
    back: dict[int, float | None] = {}
    for replica in replicas:
        heard = [
            rec["t"]
            for rec in read_jsonl(replica.effects)
            if rec["t"] >= times.writable
            and (rec["e"] == "start" or (rec["e"] == "skip" and rec.get("reason") in ANSWERS))
        ]
        back[replica.index] = min(heard) - times.writable if heard else None
    serious: dict[int, list[str]] = {}
    tracebacks: dict[int, int] = {}
    for replica in replicas:
        serious[replica.index], tracebacks[replica.index] = read_log(
            replica.log, min(times.incident, times.fault) - 1.0, times.stop
        )
    # The ledger: every run that started has its claim there; every run that finished,
    # its end.
    claims_missing = [key for key in runs if key not in ledger]
    outcomes_missing = [
        key
        for key, got in runs.items()
        if key in ledger
        and any(r.end is not None and not r.cancelled for r in got)
        and (not ledger[key]["finished"] or ledger[key]["outcome"] != "succeeded")
    ]
    claimed_not_run = [key for key in ledger if key not in runs]
    return {
        "judged_slots": len(slots) * len(jobs),
        "first_judged_slot": slots[0] if slots else None,
        "last_judged_slot": slots[-1] if slots else None,
        "runs": sum(len(v) for v in runs.values()),
        "duplicates": duplicates,
        "started_twice": started_twice,
        "missed": missed,
        "missed_slots": [
            {"job": j, "slot": s, "phase": p, "why": w, "last_answer": a}
            for j, s, p, w, a in missed_slots
        ],
        "never_run_last_answers": count(
            a for _, _, p, w, a in missed_slots if w == "missed" and p != "before"
        ),
        "misfire_reported": len(misfired),
        "first_run_after_fault_s": first_after_fault,
        "first_run_after_writable_s": first_after_writable,
        "replica_back_after_writable_s": back,
        "log_records_warning_or_above": {k: len(v) for k, v in serious.items()},
        "log_records": serious,
        "tracebacks": tracebacks,
        "ledger_claims_missing": len(claims_missing),
        "ledger_outcomes_missing": len(outcomes_missing),
        "ledger_claims_missing_list": [list(k) for k in claims_missing],
        "ledger_outcomes_missing_list": [
            [*k, ledger[k]["outcome"], ledger[k]["finished"]] for k in outcomes_missing
        ],
        "ledger_rows_not_run": len(claimed_not_run),
        "lost": sum(rec["e"] == "lost" for rec in records),
        "crashed": sum(rec["e"] == "crashed" for rec in records),
        "lock_failed": sum(rec["e"] == "failed" for rec in records),
    }


# -- one row ----------------------------------------------------------------------------------


async def run_row(fault: str, mode: str, seconds_after: float) -> dict[str, Any]:
    directory = LOGS / f"{fault}-{mode}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    result: dict[str, Any] = {
        "fault": fault,
        "mode": mode,
        "label": FAULTS[fault],
        "load_avg_at_start": os.getloadavg(),
    }
    replicas = [Replica(i, directory) for i in range(1, REPLICAS + 1)]
    async with contextlib.AsyncExitStack() as stack:
        pair = await make_pair(fault, stack)

        async def stop_replicas() -> None:
            await asyncio.gather(*(r.stop() for r in replicas))

        stack.push_async_callback(stop_replicas)  # before the servers go, and on any error
        await replicas[0].start(pair.dsn, mode)  # alone: it creates the ledger's tables
        await asyncio.gather(*(r.start(pair.dsn, mode) for r in replicas[1:]))
        judge_from = math.ceil(time.time() + WARMUP)
        fault_at = judge_from + LEAD
        incident = fault_at
        if pair.link is not None:
            incident = fault_at - LAG
            await sleep_until(incident)
            pair.link.silence()
            log(f"{fault}/{mode}: the standby's replication link fell silent")
        await sleep_until(fault_at)
        fault_t = time.time()
        writable_task = asyncio.create_task(wait_writable(pair.standby.dsn), name="writable")
        stack.push_async_callback(cancel, writable_task)
        if pair.front is not None:
            pair.front.silence()  # first: the primary's death must not reach the replicas
        if fault == "switchover":
            await asyncio.to_thread(pair.primary.stop, "fast")
        else:
            await asyncio.to_thread(pair.primary.crash)
        stopped_t = time.time()
        if fault != "switchover":
            await sleep_until(fault_t + PROMOTE_AFTER)
        behind = await replay_lag(pair.standby.dsn, fault_t)
        await asyncio.to_thread(pair.standby.promote)
        promoted_t = time.time()
        writable_t = await writable_task
        if pair.vip is not None:
            pair.vip.retarget("127.0.0.1", pair.standby.port)
        log(
            f"{fault}/{mode}: primary gone in {stopped_t - fault_t:.1f}s, standby promoted "
            f"{promoted_t - fault_t:.1f}s after the fault, writable at "
            f"+{writable_t - fault_t:.2f}s; standby was {_fmt(behind, 2)}s behind"
        )
        await sleep_until(writable_t + seconds_after)
        stop_t = time.time()
        await stop_replicas()
        ledger = await read_ledger(pair.standby.dsn)
        await dump_ledger(pair.standby.dsn, directory / "ledger.json")
    times = Times(judge_from, incident, fault_t, writable_t, stop_t)
    result.update({f"t_{name}": t for name, t in dataclasses.asdict(times).items()})
    result.update(
        t_promoted=promoted_t,
        standby_behind_s=behind,
        replica_exit_codes=[r.exit_code for r in replicas],
        replica_stop_s=[r.stop_seconds for r in replicas],
        **judge(times, replicas, ledger),
    )
    return result


async def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel *task* and wait for it to end (its own outcome is dropped; ours is not)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: a failure of a task no longer wanted is no news


# -- report -----------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(results: list[dict[str, Any]]) -> str:
    head = [
        "fault",
        "mode",
        "duplicates",
        "slots never run: during the outage / after it",
        "excused: coalesced / busy",
        "never run: the last answer a replica got",
        "first run after the fault / after writable (s)",
        "slowest replica back after writable (s)",
        "lines >= WARNING per replica",
        "tracebacks",
        "ledger rows missing: claims / outcomes",
        "standby behind (s)",
        "clean stops",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        if "error" in r:
            cells = [r["label"], r["mode"], f"failed: {r['error']}"]
            lines.append("| " + " | ".join(cells) + " |" + " |" * (len(head) - len(cells)))
            continue
        missed = r["missed"]
        back = list(r["replica_back_after_writable_s"].values())
        slowest = "never" if None in back else _fmt(max(back), 2)
        excused = (
            sum(missed[p]["coalesced"] for p in missed),
            sum(missed[p]["busy"] for p in missed),
        )
        during = missed["during"]["missed"]
        before = missed["before"]["missed"]
        cells = [
            r["label"],
            r["mode"],
            _fmt(r["duplicates"]),
            f"{during} / {missed['after']['missed']}"
            + (f" (+{before} before the fault)" if before else ""),
            f"{excused[0]} / {excused[1]}",
            ", ".join(f"{k} {v}" for k, v in r["never_run_last_answers"].items()) or "-",
            f"{_fmt(r['first_run_after_fault_s'], 2)} / {_fmt(r['first_run_after_writable_s'], 2)}",
            slowest,
            " / ".join(str(n) for n in r["log_records_warning_or_above"].values()),
            _fmt(sum(r["tracebacks"].values())),
            f"{r['ledger_claims_missing']} / {r['ledger_outcomes_missing']}",
            _fmt(behind if (behind := r["standby_behind_s"]) is None else max(0.0, behind), 2),
            f"{sum(c == 0 for c in r['replica_exit_codes'])}/{len(r['replica_exit_codes'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chosen(spec: str, known: Iterable[str], what: str) -> list[str]:
    names = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(FAULTS), help=f"of {', '.join(FAULTS)}")
    parser.add_argument("--modes", default=",".join(MODES), help="session, lease")
    parser.add_argument(
        "--seconds-after", type=float, default=30.0, help="run on after the promotion"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "failover.json")
    args = parser.parse_args()
    # SIGTERM as Ctrl-C: the row in progress unwinds (replicas stopped, proxies closed,
    # clusters destroyed) instead of leaving it all to the watchdogs.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    faults = chosen(args.rows, FAULTS, "--rows")
    modes = chosen(args.modes, MODES, "--modes")
    started = time.time()
    results: list[dict[str, Any]] = []
    for fault in faults:
        for mode in modes:
            if mode not in ONLY_MODES.get(fault, MODES):
                continue
            log(f"{fault}/{mode}: {FAULTS[fault]}")
            if fault == "pgbouncer" and pgbouncer_binary() is None:
                reason = "no pgbouncer binary (apt-get install pgbouncer)"
                results.append(
                    {"fault": fault, "mode": mode, "label": FAULTS[fault], "error": reason}
                )
                continue
            try:
                result = await run_row(fault, mode, args.seconds_after)
            except Exception as exc:  # one row's failure is reported, the others still run
                log(f"{fault}/{mode}: failed: {exc!r}")
                result = {"fault": fault, "mode": mode, "label": FAULTS[fault], "error": repr(exc)}
            else:
                missed = result["missed"]
                log(
                    f"{fault}/{mode}: dup {result['duplicates']}, never run "
                    f"{missed['during']['missed']} / {missed['after']['missed']}, ledger "
                    f"missing {result['ledger_claims_missing']} / "
                    f"{result['ledger_outcomes_missing']}"
                )
            results.append(result)
    RESULTS.mkdir(exist_ok=True)
    report = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": time.time() - started,
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "settings": {
            "replicas": REPLICAS,
            "jobs": [name for name, _ in JOBS],
            "interval_s": INTERVAL,
            "misfire_grace_s": MISFIRE_GRACE,
            "promote_after_s": PROMOTE_AFTER,
            "lag_s": LAG,
            "seconds_after": args.seconds_after,
        },
        "rows": results,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nJSON: {args.output}; effects and logs: {LOGS}/<row>-<mode>/")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: the row in progress was stopped and its servers removed")
        sys.exit(130)
