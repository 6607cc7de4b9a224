"""Fleet scale: N replica processes, one throwaway PostgreSQL (and PgBouncer) per row.

    nox -s fleet                          # every row, a 30 s window each (about 20-30 min)
    nox -s fleet -- --quick               # 10 s windows
    python benchmarks/fleet.py --rows 3,30             # the rows of 3 and of 30 replicas
    python benchmarks/fleet.py --rows b100,d60 --window 60

Each replica (contenders/fleet_replica.py) is a process of its own running K jobs
``every(interval)``; each run records its start, sleeps 0.05 s and records its end, in the
replica's own append-only JSONL file. Rows (``--rows`` takes names, config letters, or
replica counts):

- ``a3 a30 a100``: direct to the server, ``mode="session"`` (``PostgresLocker(dsn)``);
- ``b3 b30 b100``: direct, ``mode="lease"``;
- ``c3 c30 c100``: through PgBouncer (transaction mode, default_pool_size=10), lease mode;
- ``d60``: target, direct, lease mode, 60 replicas, the server at ``max_connections=100``;
- ``e100``: target, through PgBouncer, lease mode, 100 replicas x 5 jobs every 2 s;
- ``x3``: session mode through PgBouncer, which cronlock refuses (PoolerDetected): the row
  shows the refusal (LockFailed events), not runs lost in silence.

Per row: a new cluster (tests/postgres/cluster.py, max_connections 300 unless the row says
otherwise; never the machine's shared server), PgBouncer if the row has one, replica 0
started alone (it creates the tables), then the others a few at a time, each awaited until
it prints ``ready``. The measured window is the ``--window`` seconds of slots that begin
``--warmup`` seconds after the last replica is ready. Measured over it:

- expected (jobs x slots), ran once, duplicates (a slot with 2+ starts), misses (none);
- start lateness p50/p99/max (first start - slot, ms);
- peak server connections (client backends in pg_stat_activity, polled every 0.5 s on a
  connection of the driver's own, which is subtracted);
- server CPU per 1,000 runs: utime+stime of the postmaster and its children (and of the
  children it reaped: cutime+cstime), /proc, from 0.5 s before the first slot to 0.5 s
  before the slot after the last; replica CPU likewise, summed over replica processes;
  PgBouncer's CPU on its own;
- LockFailed events in the window, by cause (PoolerDetected; asyncpg's prepared
  statements, broken by a transaction pooler; connection errors; other), and connection
  errors: LockFailed/fatal events whose exception chain names one (TooManyConnections,
  refused, reset, timeout...), the lockers' connect_failures counters over their whole
  life, and the warning/error lines the replicas logged that name one.

Prints a markdown table, writes benchmarks/results/fleet-latest.json; the replicas' JSONL
files and stderr stay in benchmarks/results/fleet-logs/<row>/ until the next run of the row.
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
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPLICA = HERE / "contenders" / "fleet_replica.py"
RESULTS = HERE / "results"
LOGS = RESULTS / "fleet-logs"
sys.path.insert(0, str(ROOT / "tests" / "postgres"))

from cluster import Cluster, ClusterUnavailable  # noqa: E402
from pgbouncer import PgBouncer, PgBouncerUnavailable, pgbouncer_binary  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
CONN_RE = re.compile(  # a connection error proper (not cronlock's wrapper, LockUnavailable)
    r"TooManyConnections|too many clients|remaining connection slots|CannotConnectNow"
    r"|no more connections allowed|ConnectionRefused|ConnectionReset|ConnectionDoesNotExist"
    r"|connection was closed|PostgresConnectionError|ClientCannotConnect|InterfaceError"
    r"|TimeoutError|timed out|OSError",
    re.IGNORECASE,
)
POOLER_RE = re.compile(r"PoolerDetected|pooler or proxy", re.IGNORECASE)  # the refusal, by design
PREPARED_RE = re.compile(r"PreparedStatement|SQLStatementName|prepared statement")  # asyncpg
LOG_LINE = re.compile(r"^\d+\.\d{3} ")  # a record the replica logged (not a traceback line)


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    config: str  # a, b, c, d, e, x
    replicas: int
    jobs: int = 10
    interval: float = 1.0
    mode: str = "lease"
    pooler: bool = False
    max_connections: int = 300

    @property
    def label(self) -> str:
        via = "PgBouncer (tx, pool 10)" if self.pooler else "direct"
        return f"{via}, {self.mode}" + (
            f", max_conn {self.max_connections}" if self.max_connections != 300 else ""
        )


ROWS = (
    Row("x3", "x", 3, mode="session", pooler=True),
    *(Row(f"a{n}", "a", n, mode="session") for n in (3, 30, 100)),
    *(Row(f"b{n}", "b", n) for n in (3, 30, 100)),
    *(Row(f"c{n}", "c", n, pooler=True) for n in (3, 30, 100)),
    Row("d60", "d", 60, max_connections=100),
    Row("e100", "e", 100, jobs=5, interval=2.0, pooler=True),
)
ORDER = ("x3", "a3", "b3", "c3", "a30", "b30", "c30", "a100", "b100", "c100", "d60", "e100")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def chosen(spec: str | None) -> list[Row]:
    rows = sorted(ROWS, key=lambda r: ORDER.index(r.name))
    if not spec:
        return rows
    tokens = [t.strip().lower() for t in spec.split(",") if t.strip()]
    known = {r.name for r in rows} | {r.config for r in rows} | {str(r.replicas) for r in rows}
    unknown = [t for t in tokens if t not in known]
    if unknown:
        raise SystemExit(f"unknown --rows {unknown}; rows: {', '.join(ORDER)}")
    return [r for r in rows if r.name in tokens or r.config in tokens or str(r.replicas) in tokens]


# -- /proc --------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, list[str]] | None:
    """(ppid, fields after the command name) of *pid*, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields


def _own_cpu(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _reaped_cpu(fields: list[str]) -> float:
    return (int(fields[13]) + int(fields[14])) / TICK  # cutime, cstime


def tree_cpu(root_pid: int | None) -> float:
    """CPU seconds of *root_pid*, of the children it reaped and of its live children."""
    if root_pid is None:
        return 0.0
    found = _stat(root_pid)
    if found is None:
        return 0.0
    total = _own_cpu(found[1]) + _reaped_cpu(found[1])
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = _stat(int(entry))
            if child is not None and child[0] == root_pid:
                total += _own_cpu(child[1])
    return total


def pids_cpu(pids: list[int]) -> tuple[float, int]:
    """Summed CPU seconds of *pids* (no children), and how many of them were alive."""
    total, alive = 0.0, 0
    for pid in pids:
        found = _stat(pid)
        if found is not None:
            total += _own_cpu(found[1])
            alive += 1
    return total, alive


def classify(text: str) -> str:
    """Why a LockFailed (or fatal) event happened, from its exception chain and text."""
    if POOLER_RE.search(text):
        return "PoolerDetected"
    if PREPARED_RE.search(text):
        return "prepared statement"  # asyncpg's statement cache behind a transaction pooler
    return "connection" if CONN_RE.search(text) else "other"


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# -- one row ------------------------------------------------------------------------------


class Replica:
    def __init__(self, index: int, directory: Path) -> None:
        self.index = index
        self.out = directory / f"replica-{index:03d}.jsonl"
        self.err = directory / f"replica-{index:03d}.stderr"
        self.proc: asyncio.subprocess.Process | None = None
        self.state = "new"  # ready, failed, exited, timeout

    async def launch(self, row: Row, dsn: str, timeout: float) -> None:
        with open(self.err, "wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(REPLICA),
                "--dsn",
                dsn,
                "--id",
                str(self.index),
                "--mode",
                row.mode,
                "--jobs",
                str(row.jobs),
                "--interval",
                str(row.interval),
                "--out",
                str(self.out),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            self.state = "timeout"
            return
        self.state = {b"ready": "ready", b"failed": "failed"}.get(line.strip(), "exited")


class Sampler:
    """Client backends on the cluster every 0.5 s, minus the sampler's own connection."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self.dsn)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        while True:
            with contextlib.suppress(Exception):
                n = await self._conn.fetchval(query)
                self.samples.append((time.time(), int(n) - 1))
            await asyncio.sleep(0.5)

    def peak(self, since: float = 0.0, until: float = math.inf) -> int | None:
        inside = [n for t, n in self.samples if since <= t <= until]
        return max(inside) if inside else None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))  # a torn last line (killed) is skipped
    return records


def window_starts(
    replicas: list[Replica], slots: set[float]
) -> dict[tuple[int, float], list[tuple[float, int]]]:
    starts: dict[tuple[int, float], list[tuple[float, int]]] = {}
    for replica in replicas:
        for rec in read_jsonl(replica.out):
            if rec["e"] == "start" and round(rec["slot"], 3) in slots:
                starts.setdefault((rec["j"], round(rec["slot"], 3)), []).append(
                    (rec["t"], rec["r"])
                )
    return starts


async def sleep_until(epoch: float) -> None:
    while (left := epoch - time.time()) > 0:
        await asyncio.sleep(min(left, 1.0))


async def run_row(row: Row, args: argparse.Namespace) -> dict[str, Any]:
    directory = LOGS / row.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    result: dict[str, Any] = {
        "row": row.name,
        **dataclasses.asdict(row),
        "label": row.label,
        "load_avg_at_start": os.getloadavg(),
    }
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(Cluster(max_connections=row.max_connections))
        bouncer = None
        if row.pooler:
            bouncer = stack.enter_context(
                PgBouncer.for_dsn(
                    cluster.dsn, pool_mode="transaction", default_pool_size=10, max_client_conn=1000
                )
            )
        dsn = bouncer.dsn if bouncer is not None else cluster.dsn
        log(f"{row.name}: cluster on port {cluster.port}" + (" + pgbouncer" if bouncer else ""))
        sampler = Sampler(cluster.dsn)
        await sampler.start()
        replicas = [Replica(i, directory) for i in range(row.replicas)]
        try:
            return await _measure(row, args, cluster, bouncer, dsn, sampler, replicas, result)
        finally:
            await _stop_all(replicas)
            await sampler.stop()
    raise AssertionError("unreachable")


async def _measure(
    row: Row,
    args: argparse.Namespace,
    cluster: Cluster,
    bouncer: PgBouncer | None,
    dsn: str,
    sampler: Sampler,
    replicas: list[Replica],
    result: dict[str, Any],
) -> dict[str, Any]:
    began = time.time()
    # Replica 0 alone first: it creates the ledger's tables, without N-1 others racing it.
    await replicas[0].launch(row, dsn, args.start_timeout)
    deadline = time.time() + 10
    while time.time() < deadline and not any(
        r["e"] in ("start", "lock_failed") for r in read_jsonl(replicas[0].out)
    ):
        await asyncio.sleep(0.2)
    gate = asyncio.Semaphore(args.launch_parallel)

    async def launch(replica: Replica) -> None:
        async with gate:
            await replica.launch(row, dsn, args.start_timeout)

    await asyncio.gather(*(launch(r) for r in replicas[1:]))
    all_up = time.time()
    states: dict[str, int] = {}
    for r in replicas:
        states[r.state] = states.get(r.state, 0) + 1
    log(f"{row.name}: {row.replicas} replicas launched in {all_up - began:.1f}s: {states}")

    first = math.ceil((all_up + args.warmup) / row.interval) * row.interval
    count = max(1, round(args.window / row.interval))
    slots = [first + k * row.interval for k in range(count)]
    slot_set = {round(s, 3) for s in slots}
    pids = [r.proc.pid for r in replicas if r.proc is not None]
    win_start, win_end = first - 0.5, slots[-1] + row.interval - 0.5

    await sleep_until(win_start)
    server0, (replica0, _alive0) = tree_cpu(cluster.postmaster_pid), pids_cpu(pids)
    bouncer0 = tree_cpu(bouncer.pid) if bouncer is not None else 0.0
    await sleep_until(win_end)
    server1, (replica1, alive1) = tree_cpu(cluster.postmaster_pid), pids_cpu(pids)
    bouncer1 = tree_cpu(bouncer.pid) if bouncer is not None else 0.0
    server_peak = sampler.peak(win_start, win_end)
    bouncer_servers = None
    if bouncer is not None:
        with contextlib.suppress(Exception):
            bouncer_servers = await asyncio.to_thread(bouncer.server_connections)

    # Late starts still count (misfire grace is 60 s): wait for them, up to --tail seconds.
    expected = row.jobs * len(slots)
    tail_end = slots[-1] + args.tail
    await sleep_until(slots[-1] + 1.5)
    seen, still_since = -1, time.time()
    while True:
        starts = await asyncio.to_thread(window_starts, replicas, slot_set)
        if len(starts) != seen:
            seen, still_since = len(starts), time.time()
        stalled = time.time() - still_since >= 5.0  # nothing new for 5 s: none will come
        if len(starts) >= expected or stalled or time.time() >= tail_end:
            break
        await asyncio.sleep(1.0)
    await _stop_all(replicas)

    lateness = [(min(t for t, _ in got) - slot) * 1000 for (_, slot), got in starts.items()]
    runs = sum(len(v) for v in starts.values())
    lock_failed_win = lock_failed_all = 0
    causes_win: dict[str, int] = {}
    fatal = 0
    conn_events = 0
    errors: dict[str, int] = {}
    skips: dict[str, int] = {}
    counters: dict[str, int] = {}
    log_lines = 0
    conn_lines = pooler_lines = 0
    for replica in replicas:
        for rec in read_jsonl(replica.out):
            kind = rec["e"]
            if kind in ("lock_failed", "fatal"):
                names = [n.rsplit(".", 1)[-1] for n in rec.get("error") or ["?"]]
                key = f"{kind}:{'<-'.join(names)}"
                errors[key] = errors.get(key, 0) + 1
                text = " ".join(rec.get("error", [])) + " " + rec.get("text", "")
                cause = classify(text)
                conn_events += cause == "connection"
                if kind == "fatal":
                    fatal += 1
                elif round(rec["slot"], 3) in slot_set:
                    lock_failed_win += 1
                    causes_win[cause] = causes_win.get(cause, 0) + 1
                lock_failed_all += kind != "fatal"
            elif kind == "skipped":
                skips[rec["reason"]] = skips.get(rec["reason"], 0) + 1
            elif kind == "exit":
                for key, value in rec.items():
                    if key == "skips":
                        for reason, n in value.items():
                            skips[reason] = skips.get(reason, 0) + n
                    elif isinstance(value, int) and key not in ("r",):
                        counters[key] = counters.get(key, 0) + value
        with contextlib.suppress(OSError), open(replica.err, errors="replace") as f:
            for line in f:
                if not LOG_LINE.match(line):
                    continue
                log_lines += 1
                pooler_lines += bool(POOLER_RE.search(line))
                conn_lines += not POOLER_RE.search(line) and bool(CONN_RE.search(line))

    per_k = 1000 / runs if runs else None
    result.update(
        slots=len(slots),
        first_slot=slots[0],
        last_slot=slots[-1],
        window_s=len(slots) * row.interval,
        expected=expected,
        ran_once=sum(1 for v in starts.values() if len(v) == 1),
        duplicates=sum(1 for v in starts.values() if len(v) > 1),
        misses=expected - len(starts),
        runs=runs,
        late_p50_ms=quantile(lateness, 0.50),
        late_p99_ms=quantile(lateness, 0.99),
        late_max_ms=max(lateness) if lateness else None,
        peak_server_connections=server_peak,
        peak_server_connections_overall=sampler.peak(),
        pgbouncer_server_connections_at_end=bouncer_servers,
        server_cpu_s=server1 - server0,
        replica_cpu_s=replica1 - replica0,
        pgbouncer_cpu_s=(bouncer1 - bouncer0) if bouncer is not None else None,
        server_cpu_cores=(server1 - server0) / (win_end - win_start),
        replica_cpu_cores=(replica1 - replica0) / (win_end - win_start),
        server_cpu_per_1k=(server1 - server0) * per_k if per_k else None,
        replica_cpu_per_1k=(replica1 - replica0) * per_k if per_k else None,
        pgbouncer_cpu_per_1k=(bouncer1 - bouncer0) * per_k if per_k and bouncer else None,
        replicas_ready=sum(r.state == "ready" for r in replicas),
        replicas_alive_at_window_end=alive1,
        replica_states={
            s: sum(r.state == s for r in replicas) for s in {r.state for r in replicas}
        },
        launch_s=all_up - began,
        lock_failed_window=lock_failed_win,
        lock_failed_window_causes=causes_win,
        lock_failed_total=lock_failed_all,
        fatal=fatal,
        conn_error_events=conn_events,
        connect_failures=counters.get("connect_failures", 0),
        errors=errors,
        skips=skips,
        locker_counters=counters,
        stderr_lines=log_lines,
        stderr_conn_error_lines=conn_lines,
        stderr_pooler_lines=pooler_lines,
    )
    return result


async def _stop_all(replicas: list[Replica]) -> None:
    live = [r.proc for r in replicas if r.proc is not None and r.proc.returncode is None]
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in live:
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


# -- report -------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| row | config | replicas x jobs / every | expected | ran once | dup | miss "
        "| start p99 late ms | peak server conns | server CPU s/1k runs | replica CPU s/1k runs "
        "| PgBouncer CPU s/1k | LockFailed | conn errors (events / connect fails / log lines) "
        "| replicas not ready |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['row']} | {r['label']} | skipped: {r['skipped']} |" + " |" * 12)
            continue
        lines.append(
            "| "
            + " | ".join(
                [
                    r["row"],
                    r["label"],
                    f"{r['replicas']} x {r['jobs']} / {r['interval']:g}s",
                    _fmt(r["expected"]),
                    _fmt(r["ran_once"]),
                    _fmt(r["duplicates"]),
                    _fmt(r["misses"]),
                    _fmt(r["late_p99_ms"]),
                    _fmt(r["peak_server_connections"]),
                    _fmt(r["server_cpu_per_1k"], 2),
                    _fmt(r["replica_cpu_per_1k"], 2),
                    _fmt(r["pgbouncer_cpu_per_1k"], 2),
                    _fmt(r["lock_failed_window"])
                    + (
                        " (" + ", ".join(f"{k} {v}" for k, v in sorted(causes.items())) + ")"
                        if (causes := r["lock_failed_window_causes"])
                        else ""
                    ),
                    f"{r['conn_error_events']} / {r['connect_failures']}"
                    f" / {r['stderr_conn_error_lines']}",
                    _fmt(r["replicas"] - r["replicas_ready"]),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", help=f"comma-separated names, letters or counts ({','.join(ORDER)})"
    )
    parser.add_argument("--window", type=float, help="seconds of measured slots (default 30)")
    parser.add_argument("--quick", action="store_true", help="10 s windows")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after all are ready")
    parser.add_argument("--tail", type=float, default=20.0, help="longest wait for late starts")
    parser.add_argument("--launch-parallel", type=int, default=4, help="replicas starting at once")
    parser.add_argument("--start-timeout", type=float, default=120.0, help="per replica, seconds")
    parser.add_argument("--output", type=Path, default=RESULTS / "fleet-latest.json")
    args = parser.parse_args()
    if args.window is None:
        args.window = 10.0 if args.quick else 30.0
    rows = chosen(args.rows)
    results: list[dict[str, Any]] = []
    has_bouncer = pgbouncer_binary() is not None
    started = time.time()
    for row in rows:
        if row.pooler and not has_bouncer:
            reason = "no pgbouncer binary (apt-get install pgbouncer)"
            print(f"skipping {row.name}: {reason}", flush=True)
            results.append({"row": row.name, "label": row.label, "skipped": reason})
            continue
        log(f"{row.name}: {row.label}, {row.replicas} x {row.jobs} every {row.interval:g}s")
        try:
            result = await run_row(row, args)
        except (ClusterUnavailable, PgBouncerUnavailable) as exc:
            print(f"skipping {row.name}: {exc}", flush=True)
            results.append({"row": row.name, "label": row.label, "skipped": str(exc)})
            continue
        results.append(result)
        log(
            f"{row.name}: ran once {result['ran_once']}/{result['expected']}, "
            f"dup {result['duplicates']}, miss {result['misses']}, "
            f"p99 {_fmt(result['late_p99_ms'])} ms, peak conns {result['peak_server_connections']}"
            f", LockFailed {result['lock_failed_window']}"
        )
    RESULTS.mkdir(exist_ok=True)
    report = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": time.time() - started,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "window_s": args.window,
        "warmup_s": args.warmup,
        "rows": results,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nJSON: {args.output}; replica logs: {LOGS}/<row>/")


if __name__ == "__main__":
    asyncio.run(main())
