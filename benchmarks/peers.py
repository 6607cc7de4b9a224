"""cronlock and the peers a replicated service weighs it against, three replicas each, side by side.

    python benchmarks/peers.py                       # every scenario x contender, about 6 min
    python benchmarks/peers.py --only skew --contenders arq,cronlock --slots 20
    nox -s bench -- ...                              # (run.py; this script is separate)

Contenders (each in its own virtualenv under benchmarks/.venvs/, made from a pinned
``requirements-<name>.txt`` on first use; cronlock runs in the driver's interpreter):

- ``cronlock``: ``Scheduler`` + ``PostgresLocker`` (defaults: session mode, run ledger);
- ``arq``: arq 0.28 workers on Redis, cron jobs with ``unique=True``;
- ``procrastinate``: procrastinate 3.10 workers, ``@app.periodic`` tasks;
- ``aps4pg``: APScheduler 4.0.0a6 schedulers sharing a ``SQLAlchemyDataStore`` on
  PostgreSQL with an ``AsyncpgEventBroker``.

contenders/p_<name>.py says how each is set up and why. Scenarios, each three replica
processes of one contender (contenders/peer_replica.py), every job a no-op that records
its start (true time) and its slot as the library reports it:

- ``replicas``: N jobs (default 50) due every second, host clocks equal, *--slots*
  slots (default 20) measured;
- ``skew``: the same with the replicas' host clocks 0, +150 and +300 ms ahead of true time:
  each replica process runs under libfaketime (``LD_PRELOAD``, ``FAKETIME=+0.15``; the
  monotonic clock is left alone), so every library reads a clock that far ahead, whatever
  it reads it with; the replica is told its skew (``--offset``) and takes it off the
  starts it records, which are thus in true time; the rows say so when libfaketime is not
  installed;
- ``burst``: B jobs (default 1,000) due at one instant (``every(60)`` / once a minute at
  that second), one slot measured.

The replicas start (replica 0 first: it creates tables), then the first measured slot is
at least *--lead* seconds after launch. Measured per row: slot runs due, ran, duplicates
(a (job, slot) that ran more than once), misses, runs per replica, start − slot in true
time (p50, p99, the earliest, p99 of |start − slot|, the latest), and CPU over the window
(from 0.5 s before the first slot to 0.5 s before the slot after the last, or for the
burst to 0.25 s after its last start): the three replica processes together and the
servers (PostgreSQL's processes, redis-server), psutil samples every 0.25 s. The server's
CPU includes whatever else the machine's shared server was doing. The driver stops the
replicas once every slot has run and nothing new came for 2 s (or after *--tail* s),
then removes what the run created (its schema, its Redis keys).
Prints a markdown table; writes benchmarks/results/peers-latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from run import DEFAULT_DSN, machine, percentile, pg_available, sql, venv_python

HERE = Path(__file__).resolve().parent
CONTENDERS_DIR = HERE / "contenders"
RESULTS = HERE / "results"
LOGS = RESULTS / "peers-logs"
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SKEW = (0.0, 0.15, 0.3)  # the replicas' host clocks, seconds ahead of true time (as run.py)

NAMES = {
    "cronlock": "cronlock (PostgresLocker, defaults)",
    "arq": "arq 0.28 (Redis, cron unique=True)",
    "procrastinate": "procrastinate 3.10 (periodic tasks)",
    "aps4pg": "APScheduler 4.0.0a6 (SQLAlchemy store + asyncpg broker)",
}
USES_POSTGRES = {"cronlock", "procrastinate", "aps4pg"}


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    jobs: int
    interval: int
    slots: int
    offsets: tuple[float, float, float]
    lead: float

    def label(self) -> str:
        if self.name == "burst":
            return f"burst: {self.jobs:,} jobs due at one instant"
        clocks = "clocks 0 / +150 / +300 ms" if any(self.offsets) else "equal clocks"
        return f"{self.jobs} jobs every second, {clocks}"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def python_for(contender: str) -> str:
    return sys.executable if contender == "cronlock" else venv_python(contender)


# -- CPU ------------------------------------------------------------------------------------


def cpu_sample(pids: list[int]) -> dict[str, Any]:
    """CPU seconds now: the replicas together; each PostgreSQL and redis-server process."""
    replicas = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            replicas += t.user + t.system
    servers: dict[str, dict[int, float]] = {"postgres": {}, "redis": {}}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        name, times = proc.info["name"] or "", proc.info["cpu_times"]
        key = "postgres" if name == "postgres" else "redis" if name.startswith("redis") else ""
        if key and times is not None:
            servers[key][proc.pid] = times.user + times.system
    return {"replicas": replicas, **servers}


def cpu_between(samples: list[tuple[float, dict[str, Any]]], t0: float, t1: float) -> Any:
    """CPU seconds used from the last sample at or before t0 to the first at or after t1.

    The replicas live through the span; a server process that exits inside it counts with
    its last sample (up to 0.25 s of its CPU lost), one that starts inside it from zero.
    """
    before = [s for s in samples if s[0] <= t0]
    after = [s for s in samples if s[0] >= t1]
    if not before or not after:
        return None
    (a_t, a), (b_t, b) = before[-1], after[0]
    out = {"span_s": b_t - a_t, "replicas": b["replicas"] - a["replicas"]}
    for key in ("postgres", "redis"):
        seen: dict[int, float] = {}
        for t, sample in samples:
            if a_t < t <= b_t:
                seen.update(sample[key])
        out[key] = sum(cpu - a[key].get(pid, 0.0) for pid, cpu in seen.items())
    return out


# -- one row --------------------------------------------------------------------------------


def read_runs(path: Path) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    with contextlib.suppress(OSError), path.open() as f:
        for line in f:
            with contextlib.suppress(ValueError):
                runs.append(json.loads(line))  # a torn last line (killed) is skipped
    return runs


async def launch(
    contender: str, args: list[str], offset: float, out: Path, err: Path
) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    # The replica records time.time() minus --offset: under libfaketime that is true time.
    # (Before, --offset was never passed: each skewed replica's starts read its skew late.)
    args = [*args, f"--offset={offset}"]
    if offset:
        env.update(
            LD_PRELOAD=str(FAKETIME),
            FAKETIME=f"+{offset}",
            FAKETIME_DONT_FAKE_MONOTONIC="1",
            FAKETIME_DONT_RESET="1",
        )
    with err.open("wb") as stderr:
        return await asyncio.create_subprocess_exec(
            python_for(contender),
            "peer_replica.py",
            contender,
            *args,
            f"--out={out}",
            cwd=CONTENDERS_DIR,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )


async def wait_ready(proc: asyncio.subprocess.Process, timeout: float) -> float | None:
    """When *proc* printed ``ready`` (None: it did not, in time)."""
    assert proc.stdout is not None
    with contextlib.suppress(TimeoutError):
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        if line.strip() == b"ready":
            return time.time()
    return None


async def stop_all(procs: list[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def helper(contender: str, step: str, base: list[str]) -> None:
    """Run the contender's --setup or --teardown in its own interpreter."""
    proc = await asyncio.create_subprocess_exec(
        python_for(contender),
        "peer_replica.py",
        contender,
        step,
        *base,
        cwd=CONTENDERS_DIR,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise RuntimeError(f"{contender} {step}: {tail[0][:200]}")


async def run_row(contender: str, sc: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    ns = f"peers_{contender}_{sc.name}_{os.getpid()}"
    directory = LOGS / f"{sc.name}-{contender}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    result: dict[str, Any] = {"scenario": sc.name, "label": sc.label(), "contender": contender}
    if any(sc.offsets) and not FAKETIME.exists():
        return {**result, "skipped": f"no libfaketime ({FAKETIME}): apt-get install libfaketime"}
    base = [f"--ns={ns}", f"--dsn={args.dsn}", f"--redis={args.redis}"]
    if contender in USES_POSTGRES:
        sql(args.dsn, f"CREATE SCHEMA {ns}")
    procs: list[asyncio.subprocess.Process] = []
    try:
        await helper(contender, "--setup", base)
        began = time.time()
        first = math.ceil(began + sc.lead)
        last = first + (sc.slots - 1) * sc.interval
        common = [*base, f"--jobs={sc.jobs}", f"--first={first}", f"--interval={sc.interval}"]
        outs = [directory / f"replica{r}.jsonl" for r in range(3)]
        errs = [directory / f"replica{r}.stderr" for r in range(3)]

        async def start(r: int) -> float | None:
            proc = await launch(
                contender, [*common, f"--replica={r}"], sc.offsets[r], outs[r], errs[r]
            )
            procs.append(proc)
            return await wait_ready(proc, max(5.0, first - time.time()))

        ready = [await start(0)]  # alone first: it creates the tables
        ready += await asyncio.gather(start(1), start(2))
        result["ready_before_first_s"] = [
            round(first - t, 2) if t is not None else None for t in ready
        ]
        log(f"{sc.name} {contender}: ready {result['ready_before_first_s']} s before the slot")

        slots = {float(first + k * sc.interval) for k in range(sc.slots)}
        expected = sc.jobs * sc.slots
        samples: list[tuple[float, dict[str, Any]]] = []
        pids = [p.pid for p in procs]
        seen, still_since = -1, time.time()
        while True:
            now = time.time()
            if now >= first - 1.0:
                samples.append((now, await asyncio.to_thread(cpu_sample, pids)))
            if now >= last + 1.0:
                runs = [[x for x in read_runs(o) if x["slot"] in slots] for o in outs]
                done = len({(x["j"], x["slot"]) for rs in runs for x in rs})
                if done != seen:
                    seen, still_since = done, now
                quiet = now - still_since
                if (done >= expected and quiet >= 2.0) or quiet >= 6.0 or now >= last + args.tail:
                    break
            await asyncio.sleep(0.25)
        await stop_all(procs)
        result.update(settle(runs, sc, first, expected))
        t1 = first + sc.slots * sc.interval - 0.5
        if sc.interval == 60:
            t1 = first + (result["last_start_s"] or 0.0) + 0.25
        result["cpu"] = cpu_between(samples, first - 0.5, t1)
        result["replica_stderr_tail"] = [
            e.read_text(errors="replace").strip().splitlines()[-1:] for e in errs
        ]
        return result
    finally:
        await stop_all(procs)
        with contextlib.suppress(Exception):
            await helper(contender, "--teardown", base)
        if contender in USES_POSTGRES:
            sql(args.dsn, f"DROP SCHEMA IF EXISTS {ns} CASCADE")


def settle(
    runs: list[list[dict[str, Any]]], sc: Scenario, first: int, expected: int
) -> dict[str, Any]:
    count: dict[tuple[int, float], int] = {}
    start: dict[tuple[int, float], float] = {}
    for rs in runs:
        for x in rs:
            key = (x["j"], x["slot"])
            count[key] = count.get(key, 0) + 1
            start[key] = min(start.get(key, math.inf), x["t"] - x["slot"])
    late = sorted(start.values())
    per_replica = [len(rs) for rs in runs]
    return {
        "first_slot": first,
        "jobs": sc.jobs,
        "slots": sc.slots,
        "offsets": sc.offsets,
        "expected": expected,
        "ran": len(count),
        "duplicates": sum(c - 1 for c in count.values()),
        "misses": expected - len(count),
        "runs_per_replica": per_replica,
        "largest_share": max(per_replica) / sum(per_replica) if sum(per_replica) else None,
        "start_p50_ms": percentile(late, 50) * 1e3 if late else None,
        "start_p99_ms": percentile(late, 99) * 1e3 if late else None,
        "start_min_ms": late[0] * 1e3 if late else None,
        "start_abs_p99_ms": percentile(sorted(map(abs, late)), 99) * 1e3 if late else None,
        "last_start_s": late[-1] if late else None,
    }


# -- report ---------------------------------------------------------------------------------


def num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.{digits}f}"
    return f"{value:,}"


def table(results: list[dict[str, Any]]) -> str:
    header = [
        "scenario",
        "contender",
        "slot runs due",
        "ran",
        "dup",
        "miss",
        "runs per replica",
        "start p50 ms",
        "p99 ms",
        "earliest ms",
        "\\|start − slot\\| p99 ms",
        "latest s",
        "replica CPU s",
        "server CPU s (PostgreSQL / Redis)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in results:
        head = [r["label"], NAMES[r["contender"]]]
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or f"error: {r['error']}"
            lines.append("| " + " | ".join([*head, why, *[""] * (len(header) - 3)]) + " |")
            continue
        cpu = r.get("cpu") or {}
        cells = [
            *head,
            num(r["expected"]),
            num(r["ran"]),
            num(r["duplicates"]),
            num(r["misses"]),
            " / ".join(f"{n:,}" for n in r["runs_per_replica"]),
            num(r["start_p50_ms"]),
            num(r["start_p99_ms"]),
            num(r["start_min_ms"]),
            num(r["start_abs_p99_ms"]),
            num(r["last_start_s"], 2),
            num(cpu.get("replicas"), 2),
            f"{num(cpu.get('postgres'), 2)} / {num(cpu.get('redis'), 2)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=("replicas", "skew", "burst"))
    parser.add_argument("--contenders", default=",".join(NAMES), help="comma-separated")
    parser.add_argument("--jobs", type=int, default=50, help="replicas and skew: jobs")
    parser.add_argument("--slots", type=int, default=20, help="replicas and skew: slots")
    parser.add_argument("--burst-jobs", type=int, default=1000)
    parser.add_argument("--lead", type=float, default=8.0, help="launch to first slot, s")
    parser.add_argument("--burst-lead", type=float, default=15.0)
    parser.add_argument("--tail", type=float, default=30.0, help="longest wait after the last")
    parser.add_argument("--dsn", default=os.environ.get("CRONLOCK_BENCH_DSN") or DEFAULT_DSN)
    parser.add_argument("--redis", default=os.environ.get("CRONLOCK_BENCH_REDIS", "127.0.0.1:6379"))
    parser.add_argument("--output", type=Path, default=RESULTS / "peers-latest.json")
    args = parser.parse_args()
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(contenders) - set(NAMES))
    if unknown:
        raise SystemExit(f"unknown contenders {unknown}; known: {', '.join(NAMES)}")
    scenarios = [
        Scenario("replicas", args.jobs, 1, args.slots, (0.0, 0.0, 0.0), args.lead),
        Scenario("skew", args.jobs, 1, args.slots, SKEW, args.lead),
        Scenario("burst", args.burst_jobs, 60, 1, (0.0, 0.0, 0.0), args.burst_lead),
    ]
    scenarios = [s for s in scenarios if not args.only or s.name in args.only]
    problem = pg_available(args.dsn)
    if problem is not None:
        raise SystemExit(f"PostgreSQL at {args.dsn} unreachable: {problem}")
    for contender in contenders:  # create the virtualenvs before anything is timed
        python_for(contender)
    started = time.time()
    results: list[dict[str, Any]] = []
    for k, sc in enumerate(scenarios):
        for contender in contenders if k % 2 == 0 else contenders[::-1]:
            log(f"{sc.name} {contender}: {sc.label()}")
            try:
                row = await run_row(contender, sc, args)
            except Exception as exc:  # one contender failing does not stop the others
                row = {"scenario": sc.name, "label": sc.label(), "contender": contender}
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            log(f"{sc.name} {contender}: { {k: v for k, v in row.items() if k != 'label'} }")
            results.append(row)
    order = {c: i for i, c in enumerate(NAMES)}
    results.sort(
        key=lambda r: ([s.name for s in scenarios].index(r["scenario"]), order[r["contender"]])
    )
    RESULTS.mkdir(exist_ok=True)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": machine(),
        "load_avg_at_end": os.getloadavg(),
        "seconds": round(time.time() - started),
        "rows": results,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\n{report['date']}, {report['seconds']} s; JSON: {args.output}; logs: {LOGS}/")


if __name__ == "__main__":
    asyncio.run(main())
