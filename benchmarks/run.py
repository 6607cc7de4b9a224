"""cronlock benchmarks side by side with its peers: `nox -s bench` or `python benchmarks/run.py`.

Each scenario x contender runs in its own subprocess (benchmarks/contenders/), which
prints one JSON result; contenders alternate order between repeats. APScheduler 3 and 4
share the ``apscheduler`` import name, so each gets a virtualenv under benchmarks/.venvs/,
created on first use. Prints markdown tables (ratios against APScheduler 3 and against the
floor row), writes benchmarks/results/latest.json, and with --update-readme puts the
tables into benchmarks/README.md. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from report import render, targets

HERE = Path(__file__).resolve().parent
CONTENDERS_DIR = HERE / "contenders"
VENVS = HERE / ".venvs"
RESULTS = HERE / "results"
CONTENDERS = ("floor", "model", "cronlock", "aps3", "aps4", "aiocron")
SCENARIOS = ("precision", "scale", "coordination", "replicas", "burst", "skew", "import")
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

FULL: dict[str, Any] = {
    "precision_jobs": [1000, 10000],
    "precision_seconds": 5,
    "baseline": 1.0,
    "scale": {"jobs": 100_000, "interval": 60, "spread": 30, "idle": 10},
    "scale_repeats": 1,
    "coordination_runs": 2000,
    "replica_jobs": 1000,
    "replica_slots": 5,
    "replica_ledger": [True, False],
    "burst_jobs": [1000, 10000],
    "burst_window": 50,
    "skew_jobs": [1, 50],
    "skew_slots": 20,
    "import_repeats": 10,
}
QUICK: dict[str, Any] = {
    "precision_jobs": [10000],
    "precision_seconds": 2,
    "baseline": 0.3,
    "scale": {"jobs": 10_000, "interval": 10, "spread": 3, "idle": 3},
    "scale_repeats": 1,
    "coordination_runs": 300,
    "replica_jobs": 1000,
    "replica_slots": 3,
    "replica_ledger": [True, False],
    "burst_jobs": [1000],
    "burst_window": 50,
    "skew_jobs": [50],
    "skew_slots": 10,
    "import_repeats": 3,
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- interpreters -------------------------------------------------------------------------


def venv_python(name: str) -> str:
    """The interpreter of benchmarks/.venvs/<name>, created from requirements-<name>.txt."""
    requirements = HERE / f"requirements-{name}.txt"
    venv = VENVS / name
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    stamp = venv / ".requirements.sha256"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return str(python)
    log(f"creating {venv} from {requirements.name} ...")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", str(requirements)],
        check=True,
        timeout=600,
    )
    stamp.write_text(digest)
    return str(python)


def python_for(contender: str) -> str:
    return venv_python(contender) if contender in ("aps3", "aps4") else sys.executable


# -- running one measurement ----------------------------------------------------------------


def run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run *cmd*; its last stdout line is the JSON result. Errors become {"error": ...}."""
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=CONTENDERS_DIR
        )
    except subprocess.TimeoutExpired:  # subprocess.run kills the child
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"error": tail[0][:200]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def alternating(repeat: int) -> tuple[str, ...]:
    return CONTENDERS if repeat % 2 == 0 else CONTENDERS[::-1]


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-metric median over the repeats that succeeded (the error of the last failure)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[-1].get("error", "no run") if runs else "no run"}
    out: dict[str, Any] = {"repeats": len(good)}
    for key, value in good[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in good)
        else:
            out[key] = value
    return out


# -- scenarios --------------------------------------------------------------------------------


def precision(cfg: dict[str, Any], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for jobs in cfg["precision_jobs"]:
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
        for repeat in range(repeats):
            for contender in alternating(repeat):
                cmd = [
                    python_for(contender),
                    "harness.py",
                    contender,
                    "precision",
                    f"--jobs={jobs}",
                    f"--seconds={cfg['precision_seconds']}",
                    f"--baseline={cfg['baseline']}",
                ]
                result = run_json(cmd, timeout=60 + jobs / 500 + cfg["precision_seconds"])
                log(f"precision {jobs} {contender}: {result}")
                runs[contender].append(result)
        out[str(jobs)] = {c: median_of(r) for c, r in runs.items()}
    return out


def scale(cfg: dict[str, Any], repeats: int) -> dict[str, Any]:
    sc = cfg["scale"]
    lead = 5 + int(sc["jobs"] * 200e-6)  # registration time allowed before the first slots
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    for repeat in range(repeats):
        for contender in alternating(repeat):
            cmd = [
                python_for(contender),
                "harness.py",
                contender,
                "scale",
                f"--jobs={sc['jobs']}",
                f"--interval={sc['interval']}",
                f"--spread={sc['spread']}",
                f"--idle={sc['idle']}",
                f"--lead={lead}",
            ]
            result = run_json(cmd, timeout=lead + 3 * sc["interval"] + 120)
            log(f"scale {contender}: {result}")
            runs[contender].append(result)
    return {"params": sc, **{c: median_of(r) for c, r in runs.items()}}


def coordination(cfg: dict[str, Any], dsn: str) -> dict[str, Any]:
    cmd = [sys.executable, "coordination.py", dsn, f"--runs={cfg['coordination_runs']}"]
    result = run_json(cmd, timeout=180)
    log(f"coordination: {result}")
    return result


def replicas(cfg: dict[str, Any], dsn: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    jobs, slots = cfg["replica_jobs"], cfg["replica_slots"]
    schema = f"cronlock_bench_replicas_{os.getpid()}"
    sql(dsn, f"CREATE SCHEMA {schema}")
    try:
        for ledger in cfg["replica_ledger"]:
            label = "run ledger (default)" if ledger else "lock alone (ledger=False)"
            first = int(time.time()) + 5  # every replica is up and registered by then
            args = [f"--jobs={jobs}", f"--first={first}", f"--slots={slots}"]
            args += [f"--schema={schema}"] if ledger else []
            results, _ = run_replicas(dsn, args, timeout=slots + 60)
            out[label] = settle(results, jobs, first, slots, 1)
            log(f"replicas, {label}: {out[label]}")
    finally:
        sql(dsn, f"DROP SCHEMA {schema} CASCADE")
    return out


def burst(cfg: dict[str, Any], dsn: str) -> dict[str, Any]:
    """Three replicas, N jobs ``every(60)`` all anchored at one instant: one slot measured."""
    out: dict[str, Any] = {}
    window = cfg["burst_window"]
    schema = f"cronlock_bench_burst_{os.getpid()}"
    sql(dsn, f"CREATE SCHEMA {schema}")
    try:
        for jobs in cfg["burst_jobs"]:
            lead = 5 + jobs / 1000  # importing and registering N jobs in three processes
            first = int(time.time() + lead)
            args = [f"--jobs={jobs}", f"--first={first}", "--slots=1", "--interval=60"]
            args += [f"--window={window}", f"--schema={schema}"]
            results, cpu = run_replicas(dsn, args, timeout=lead + window + 60, first=first)
            r = settle(results, jobs, first, 1, 60)
            if "error" not in r:
                end = max(end for x in results for *_, end in x["runs"]) if r["ran"] else first
                r["server_cpu_pct"] = cpu(first, end)
                r["ready_before_first_s"] = min(x["ready_before_first_s"] for x in results)
            out[str(jobs)] = r
            log(f"burst, {jobs} jobs: {r}")
    finally:
        sql(dsn, f"DROP SCHEMA {schema} CASCADE")
    return out


SKEW_OFFSETS = (0.0, 0.15, 0.3)  # the replicas' host clocks, seconds ahead of true time
SKEW_MODES = {
    "host clocks (fleet_clock=False)": ["--host-clock"],
    "fleet time, no race (spread=0)": ["--spread=0"],
    "fleet time + fair race (default)": [],
}


def skew(cfg: dict[str, Any], dsn: str) -> dict[str, Any]:
    """Three replicas whose host clocks are 0 / +150 / +300 ms ahead, N jobs every second,
    run ledger on: host clocks, fleet time alone, fleet time with the fair race."""
    out: dict[str, Any] = {}
    slots = cfg["skew_slots"]
    schema = f"cronlock_bench_skew_{os.getpid()}"
    sql(dsn, f"CREATE SCHEMA {schema}")
    try:
        for jobs, (mode, extra) in itertools.product(cfg["skew_jobs"], SKEW_MODES.items()):
            label = f"{jobs} job{'s' if jobs > 1 else ''}: {mode}"
            first = int(time.time()) + 5
            args = [f"--jobs={jobs}", f"--first={first}", f"--slots={slots}"]
            args += [f"--schema={schema}", *extra]
            offsets = [[f"--offset={o}"] for o in SKEW_OFFSETS]
            results, _ = run_replicas(dsn, args, timeout=slots + 60, per_replica=offsets)
            out[label] = settle(results, jobs, first, slots, 1)
            log(f"skew, {label}: {out[label]}")
    finally:
        sql(dsn, f"DROP SCHEMA {schema} CASCADE")
    return out


CpuShare = Callable[[float, float], float | None]


def run_replicas(
    dsn: str,
    args: list[str],
    timeout: float,
    first: float | None = None,
    per_replica: list[list[str]] | None = None,
) -> tuple[list[dict[str, Any]], CpuShare]:
    """Run three replica.py processes with *args* (and each its *per_replica* ones); their
    results and the server's CPU.

    The second value maps a span (t0, t1) to the PostgreSQL server processes' CPU time over
    it as a percentage of the machine (all cores), from psutil samples taken every 0.25 s
    from just before *first* until the replicas exit (None when not sampled).
    """
    # Job names of this run alone: advisory locks are per database, not per schema, so two
    # runs on one server at once (or a test suite) would otherwise take each other's locks.
    prefix = f"bench-{os.getpid()}-{time.monotonic_ns()}"
    cmd = [sys.executable, "replica.py", dsn, *args, f"--prefix={prefix}"]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, f"replica{r}.out") for r in range(3)]
        errs = [Path(tmp, f"replica{r}.err") for r in range(3)]
        procs = []
        for r in range(3):
            with outs[r].open("w") as stdout, errs[r].open("w") as stderr:
                procs.append(
                    subprocess.Popen(
                        [*cmd, f"--replica={r}", *(per_replica[r] if per_replica else [])],
                        cwd=CONTENDERS_DIR,
                        stdout=stdout,
                        stderr=stderr,
                        text=True,
                    )
                )
        samples: list[tuple[float, dict[int, float]]] = []
        deadline = time.time() + timeout
        try:
            while any(p.poll() is None for p in procs) and time.time() < deadline:
                if first is not None and time.time() > first - 1:
                    samples.append((time.time(), server_cpu()))
                time.sleep(0.25)
            if first is not None:
                samples.append((time.time(), server_cpu()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        results = []
        for proc, out, err in zip(procs, outs, errs, strict=True):
            lines = out.read_text().strip().splitlines()
            if proc.returncode != 0 or not lines:
                tail = err.read_text().strip().splitlines() or [f"exit {proc.returncode}"]
                results.append({"error": tail[-1][:200]})
            else:
                results.append(json.loads(lines[-1]))

    def share(t0: float, t1: float) -> float | None:
        before = [s for s in samples if s[0] <= t0]
        after = [s for s in samples if s[0] >= t1]
        if not before or not after or not after[0][1]:
            return None
        (a_t, a), b_t = before[-1], after[0][0]
        # a backend that exits before b_t counts with its last sample (<= 0.25 s lost)
        seen: dict[int, float] = {}
        for t, sample in samples:
            if a_t < t <= b_t:
                seen.update(sample)
        used = sum(cpu - a.get(pid, 0.0) for pid, cpu in seen.items())
        return 100 * used / ((b_t - a_t) * (os.cpu_count() or 1))

    return results, share


def server_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each process named postgres on this machine."""
    out: dict[int, float] = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if proc.info["name"] == "postgres" and times is not None:
            out[proc.pid] = times.user + times.system
    return out


def sql(dsn: str, statement: str) -> None:
    code = (
        "import asyncio, asyncpg, sys\n"
        "async def main():\n"
        "    c = await asyncpg.connect(sys.argv[1], timeout=10)\n"
        "    await c.execute(sys.argv[2]); await c.close()\n"
        "asyncio.run(main())"
    )
    subprocess.run([sys.executable, "-c", code, dsn, statement], check=True, timeout=60)


def settle(
    results: list[dict[str, Any]], jobs: int, first: int, slots: int, interval: int
) -> dict[str, Any]:
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        return {"error": errors[0]}
    count: dict[tuple[int, int], int] = {}
    last_end: dict[int, float] = {}
    late: list[float] = []
    for r in results:
        for job, slot, start, end in r["runs"]:
            count[(job, slot)] = count.get((job, slot), 0) + 1
            last_end[slot] = max(last_end.get(slot, 0.0), end)
            late.append(start - slot)
    late.sort()
    expected = jobs * slots
    measured = range(first, first + slots * interval, interval)
    settles = [last_end[s] - s for s in measured if s in last_end]
    return {
        "expected": expected,
        "ran": len(count),
        "duplicates": sum(c - 1 for c in count.values()),
        "misses": expected - len(count),
        "start_p50_ms": percentile(late, 50) * 1e3 if late else None,
        "start_p99_ms": percentile(late, 99) * 1e3 if late else None,
        # how far from the slot in true time, early or late (early: a fast host clock)
        "start_abs_p99_ms": percentile(sorted(map(abs, late)), 99) * 1e3 if late else None,
        "start_min_ms": late[0] * 1e3 if late else None,
        "last_start_s": late[-1] if late else None,
        "settle_p50_s": statistics.median(settles) if settles else None,
        "settle_max_s": max(settles) if settles else None,
        "runs_per_replica": [len(r["runs"]) for r in results],
        # every replica tries every (job, slot): its statements per slot run due
        "round_trips": [r["statements"] / expected for r in results],
        "replica_cpu_s": [r["cpu_s"] for r in results],
        # each replica's acquires, by answer (counted since its locker was made)
        "acquires": [
            {k: r[k] for k in ("granted", "contended", "already_ran", "busy_here") if k in r}
            for r in results
        ],
    }


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


IMPORTS = {
    # Names load on first use (PEP 562), so the bare imports are cheap; the "from" rows
    # are what a service with interval jobs, and one with a PostgreSQL locker, imports.
    "cronlock": [
        "cronlock",
        "cronlock.postgres",
        "cronlock; from cronlock import Scheduler, every",
        "cronlock.postgres; from cronlock.postgres import PostgresLocker",
    ],
    "aps3": ["apscheduler", "apscheduler.schedulers.asyncio"],
    "aps4": ["apscheduler", "apscheduler._schedulers.async_"],
    "aiocron": ["aiocron"],
}


def imports(cfg: dict[str, Any]) -> dict[str, Any]:
    # Installed packages import from bytecode that pip compiled at install; cronlock runs
    # from its source tree, where PYTHONDONTWRITEBYTECODE (set in some environments) would
    # leave none, and every fresh interpreter would compile cronlock's modules while the
    # contenders load theirs. Compile it once first, as installing a wheel does.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(HERE.parent / "src" / "cronlock")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    samples: dict[str, list[float]] = {}
    for repeat in range(cfg["import_repeats"]):
        order = list(IMPORTS) if repeat % 2 == 0 else list(IMPORTS)[::-1]
        for contender in order:
            for module in IMPORTS[contender]:
                code = (
                    "import time; t = time.perf_counter(); import "
                    f"{module}; print(time.perf_counter() - t)"
                )
                done = subprocess.run(
                    [python_for(contender), "-c", code],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    cwd=HERE.parent / "src" if contender == "cronlock" else HERE,
                )
                if done.returncode == 0:
                    samples.setdefault(f"{contender}:{module}", []).append(float(done.stdout))
    out = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
    log(f"import (ms): {out}")
    return out


# -- the driver --------------------------------------------------------------------------------


def pg_available(dsn: str) -> str | None:
    code = (
        "import asyncio, asyncpg, sys\n"
        "async def main():\n"
        "    c = await asyncpg.connect(sys.argv[1], timeout=5); await c.close()\n"
        "asyncio.run(main())"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, dsn], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return "connecting timed out"
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def update_readme(table: str) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    readme.write_text(f"{head}{start}\n{table}\n{end}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a minute or two")
    parser.add_argument("--only", action="append", choices=SCENARIOS, help="repeatable")
    parser.add_argument("--repeats", type=int, default=None, help="default: 2 (quick: 1)")
    parser.add_argument("--dsn", default=os.environ.get("CRONLOCK_BENCH_DSN") or DEFAULT_DSN)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 2)
    wanted = args.only or list(SCENARIOS)
    began = time.time()
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "mode": "quick" if args.quick else "full",
        "repeats": repeats,
    }
    if "precision" in wanted:
        results["precision"] = precision(cfg, repeats)
    if "scale" in wanted:
        results["scale"] = scale(cfg, min(repeats, cfg["scale_repeats"]))
    if {"coordination", "replicas", "burst", "skew"} & set(wanted):
        problem = pg_available(args.dsn)
        if problem is not None:
            log(f"PostgreSQL at {args.dsn} unreachable ({problem}): skipping its scenarios")
        else:
            if "coordination" in wanted:
                results["coordination"] = coordination(cfg, args.dsn)
            if "replicas" in wanted:
                results["replicas"] = replicas(cfg, args.dsn)
            if "burst" in wanted:
                results["burst"] = burst(cfg, args.dsn)
            if "skew" in wanted:
                results["skew"] = skew(cfg, args.dsn)
    if "import" in wanted:
        results["import"] = imports(cfg)
    results["elapsed_s"] = round(time.time() - began)
    results["targets"] = targets(results)
    table = render(results)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {RESULTS / 'latest.json'} ({results['elapsed_s']} s)")
    if args.update_readme:
        update_readme(table)


if __name__ == "__main__":
    main()
