"""The nemesis soak: three replicas, a dozen jobs, random faults, one checker.

    nox -s soak                                   # both modes, 60 s of faults each
    nox -s soak -- --minutes 30                   # the long run
    python benchmarks/soak/run.py --mode lease --seconds 60 --seed 1234

Per mode, a throwaway PostgreSQL cluster (tests/postgres/cluster.py, never the machine's
server) and, for lease mode, PgBouncer in transaction mode in front of it; per replica a
TCP proxy (faultproxy.py) between the replica and the server (session) or the pooler (lease), so
that a fault hits one replica at a time. Three replica processes (replica.py) run the
soak's jobs. After a warm-up a seeded nemesis injects one fault at a time, every few
seconds: SIGKILL (the replica is restarted at once), SIGSTOP for 0.5-3.5 s, a partition
of one replica for 1-10 s, a connection reset, a server crash-restart (``pg_ctl restart -m
immediate``) and a clock step of 1-5 s on one replica. Half the faults are followed by a
quiet spell until their window closes, so that slots outside every window are judged too.
Then the replicas are stopped with SIGTERM, and the checker (checker.py) judges every slot
from the end of the warm-up to the stop.

The run fails (exit status 1) on a slot finished twice, an overlap outside a partition, a
slot missed outside every fault window, a replica that did not stop cleanly, or anything
of cronlock's left on the server afterwards (an advisory lock, a session, a live lease).
Evidence (effects files, replica logs, the faults, the verdict) is kept in
benchmarks/results/soak/<mode>-<seed>/ on failure (and with ``--keep``), with the command
that reruns the same seed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import asyncpg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "soak"
sys.path.insert(0, str(ROOT / "tests" / "postgres"))
sys.path.insert(0, str(HERE))

from checker import Fault, Job, Verdict, check, read_effects  # noqa: E402
from cluster import Cluster  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from pgbouncer import PgBouncer  # noqa: E402
from replica import HEARTBEAT, JOBS, KEEPALIVES, LEASE, STATEMENT_TIMEOUT  # noqa: E402

from cronlock.postgres._conn.backoff import RECONNECT_MAX  # noqa: E402

REPLICAS = 3
KINDS = ("kill", "pause", "partition", "reset", "restart", "clock")
SERVER_NOTICE = KEEPALIVES.idle + KEEPALIVES.interval * KEEPALIVES.count  # ~6 s
DETECT = HEARTBEAT + STATEMENT_TIMEOUT
"""Session mode: a replica notices its dead lock session within heartbeat + timeout."""
SLACK = 2.0
LOGIN_RETRY = 2
"""PgBouncer's ``server_login_retry`` in the soak (its default, 15 s, makes every server
restart cost 15 s of runs through the pooler: docs/guides/poolers.md)."""


def window_after(kind: str, mode: str) -> float:
    """Seconds after a fault ends in which it may still cost slots, from the documented
    bounds: reconnect backoff (``RECONNECT_MAX``), detection of a dead session
    (heartbeat + statement timeout), the lease (lease mode: a lease taken by a claim whose
    answer was lost, or held by a killed or cut-off replica, must expire), plus slack."""
    lease = LEASE if mode == "lease" else 0.0
    return {
        "kill": lease,
        "pause": RECONNECT_MAX + DETECT,
        "partition": RECONNECT_MAX + DETECT + lease,
        "reset": RECONNECT_MAX + DETECT + lease,
        "restart": RECONNECT_MAX + DETECT + lease + (LOGIN_RETRY if mode == "lease" else 0),
        "clock": 0.0,
    }[kind] + SLACK


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Replica:
    """One replica process, restarted after a SIGKILL; its effects file outlives it."""

    def __init__(self, index: int, dsn: str, mode: str, evidence: Path) -> None:
        self.index, self.dsn, self.mode = index, dsn, mode
        self.effects = evidence / f"effects-{index}.jsonl"
        self.log = evidence / f"replica-{index}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.pids: list[int] = []

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        with open(self.log, "ab") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / "replica.py"),
                "--dsn", self.dsn,
                "--mode", self.mode,
                "--id", str(self.index),
                "--effects", str(self.effects),
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )  # fmt: skip
        self.pids.append(self.process.pid)
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"replica {self.index} did not start: {line!r} (see {self.log})")

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signum)

    async def kill_and_restart(self) -> int:
        assert self.process is not None
        pid = self.process.pid
        self.signal(signal.SIGKILL)
        await self.process.wait()
        await self.start()
        return pid

    async def stop(self) -> str | None:
        """SIGTERM; ``None`` if the replica stopped cleanly, else what went wrong."""
        assert self.process is not None and self.process.stdout is not None
        if self.process.returncode is not None:
            return f"replica {self.index} had exited with status {self.process.returncode}"
        self.signal(signal.SIGTERM)
        try:
            rest = await asyncio.wait_for(self.process.stdout.read(), 30)
            code = await asyncio.wait_for(self.process.wait(), 5)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            await self.process.wait()
            return f"replica {self.index} did not stop within 30 s of SIGTERM"
        if code != 0 or b"stopped" not in rest:
            return f"replica {self.index} stopped with status {code} (output {rest[-200:]!r})"
        return None


class Nemesis:
    """One fault at a time, chosen by a seeded generator, logged as :class:`Fault`."""

    def __init__(
        self,
        rng: random.Random,
        mode: str,
        replicas: list[Replica],
        proxies: list[FaultProxy],
        cluster: Cluster,
    ) -> None:
        self.rng, self.mode = rng, mode
        self.replicas, self.proxies, self.cluster = replicas, proxies, cluster
        self.faults: list[Fault] = []

    async def run(self, until: float) -> None:
        while True:
            kind = self.rng.choice(KINDS)
            index = self.rng.randrange(len(self.replicas))
            duration = {"pause": (0.5, 3.5), "partition": (1.0, 10.0)}.get(kind, (0.0, 0.0))
            seconds = self.rng.uniform(*duration)
            step = self.rng.choice((-1, 1)) * self.rng.uniform(1.0, 5.0)
            settle = self.rng.random() < 0.5
            gap = self.rng.uniform(1.0, 4.0)
            if time.time() + seconds + 1 >= until:
                return
            fault = await self.inject(kind, index, seconds, step)
            self.faults.append(fault)
            log(f"fault {len(self.faults)}: {fault.kind} {fault.detail}")
            resume = (fault.window_end if settle else fault.end) + gap
            await asyncio.sleep(max(0.0, min(resume, until) - time.time()))
            if time.time() >= until:
                return

    async def inject(self, kind: str, index: int, seconds: float, step: float) -> Fault:
        replica, proxy = self.replicas[index], self.proxies[index]
        start = time.time()
        pids: tuple[int, ...] = ()
        target: int | None = index
        detail = f"on r{index}"
        if kind == "kill":
            pids = (await replica.kill_and_restart(),)
            detail += f" (pid {pids[0]}, restarted as {replica.pid})"
        elif kind == "pause":
            replica.signal(signal.SIGSTOP)
            await asyncio.sleep(seconds)
            replica.signal(signal.SIGCONT)
            detail += f" for {seconds:.1f} s"
        elif kind == "partition":
            proxy.partition()
            await asyncio.sleep(seconds)
            proxy.heal()
            detail += f" for {seconds:.1f} s"
        elif kind == "reset":
            proxy.reset()
        elif kind == "restart":
            target, detail = None, "of the server"
            await asyncio.to_thread(self.cluster.restart, "immediate")
        elif kind == "clock":
            replica.effects.with_suffix(".jsonl.clock").write_text(f"{step:.3f}")
            replica.signal(signal.SIGUSR1)
            detail += f" to {step:+.1f} s"
        end = time.time()
        return Fault(kind, target, start, end, end + window_after(kind, self.mode), pids, detail)


async def leftovers(cluster: Cluster, bouncer: PgBouncer | None) -> list[str]:
    """What of cronlock's the server (and the pooler) still hold, once every replica stopped."""
    found: list[str] = []
    if bouncer is not None:
        clients = [
            c
            for c in bouncer.show("CLIENTS")
            if c.get("application_name", "").startswith("cronlock")
        ]
        if clients:
            found.append(f"{len(clients)} client(s) still connected to PgBouncer")
        bouncer.stop()  # its own server connections are the pooler's, not cronlock's
    conn = await asyncpg.connect(cluster.dsn)
    try:
        for _ in range(50):  # a backend exits a moment after its client closed
            sessions = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'cronlock%'"
            )
            locks = await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype='advisory'")
            if not sessions and not locks:
                break
            await asyncio.sleep(0.2)
        if sessions:
            found.append(f"{sessions} session(s) of cronlock still on the server")
        if locks:
            found.append(f"{locks} advisory lock(s) still held")
        live = await conn.fetchval(
            "SELECT count(*) FROM cronlock_runs_leases WHERE expires_at > clock_timestamp()"
        )  # the table is made in either mode
        if live:
            found.append(f"{live} lease(s) still live")
    finally:
        await conn.close()
    return found


async def soak(mode: str, seconds: float, seed: int, warmup: float, evidence: Path) -> bool:
    """One soak of *mode*; True when every rule held."""
    rng = random.Random(seed)
    shutil.rmtree(evidence, ignore_errors=True)
    evidence.mkdir(parents=True)
    log(f"soak {mode}: seed {seed}, {seconds:.0f} s of faults after {warmup:.0f} s of warm-up")
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(Cluster())
        bouncer = None
        target_port = cluster.port
        if mode == "lease":
            bouncer = stack.enter_context(
                PgBouncer.for_dsn(
                    cluster.dsn,
                    default_pool_size=10,
                    settings={"server_login_retry": str(LOGIN_RETRY)},
                )
            )
            target_port = bouncer.port
        proxies = [
            FaultProxy("127.0.0.1", target_port, server_notice=SERVER_NOTICE)
            for _ in range(REPLICAS)
        ]
        replicas = []
        for i, proxy in enumerate(proxies):
            await proxy.start()
            dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
            replicas.append(Replica(i, dsn, mode, evidence))
        try:
            for replica in replicas:  # replica 0 alone first: it creates the tables
                await replica.start()
            judged_from = time.time() + warmup
            await asyncio.sleep(warmup)
            nemesis = Nemesis(rng, mode, replicas, proxies, cluster)
            await nemesis.run(until=judged_from + seconds)
            await asyncio.sleep(max(0.0, judged_from + seconds - time.time()))
            judged_to = time.time()
            for replica in replicas:
                if (problem := await replica.stop()) is not None:
                    problems.append(problem)
            problems += await leftovers(cluster, bouncer)
        finally:
            for replica in replicas:
                replica.signal(signal.SIGKILL)
            for proxy in proxies:
                await proxy.close()
    (evidence / "faults.json").write_text(json.dumps([f.__dict__ for f in nemesis.faults]))
    run = {"mode": mode, "seed": seed, "from": judged_from, "to": judged_to, "problems": problems}
    (evidence / "run.json").write_text(json.dumps(run))
    return judge(evidence)


def judge(evidence: Path) -> bool:
    """Judge the evidence of a soak (its effects files, faults and run); True if it passed.
    Writes verdict.json beside it."""
    run = json.loads((evidence / "run.json").read_text())
    faults = [
        Fault(**{**f, "pids": tuple(f["pids"])})
        for f in json.loads((evidence / "faults.json").read_text())
    ]
    records = read_effects(sorted(evidence.glob("effects-*.jsonl")))
    jobs = [Job(j.name, j.interval, j.duration, j.recover) for j in JOBS]
    verdict = check(records, faults, jobs, run["from"], run["to"])
    report(run["mode"], run["seed"], verdict, run["problems"])
    (evidence / "verdict.json").write_text(json.dumps({**run, **verdict.as_dict()}))
    return not (verdict.failures or run["problems"])


def report(mode: str, seed: int, v: Verdict, problems: list[str]) -> None:
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(v.faults.items())) or "none"
    inside = ", ".join(f"{kind} {n}" for kind, n in sorted(v.misses_inside.items())) or "none"
    print(f"## soak, {mode} mode, seed {seed}, {v.judged_to - v.judged_from:.0f} s judged")
    print(f"- faults: {sum(v.faults.values())} ({faults})")
    print(f"- slots judged: {v.slots}; ran {v.ran}; skipped while their job ran: {v.busy}")
    print(f"- runs: {v.runs} (cancelled {v.cancelled}, killed {v.killed})")
    print(f"- slots finished twice: {len(v.duplicates)}; started twice: {v.double_starts}")
    twice = len(v.recovered_twice)
    print(f"- recover=True slots rerun after a finished run's outcome was lost: {twice}")
    print(
        f"- overlaps: outside partitions {len(v.overlaps_outside)}, inside {len(v.overlaps_inside)}"
    )
    print(f"- misses: outside fault windows {len(v.misses_outside)}; inside: {inside}")
    print(f"- recover=True slots never finished: {len(v.unrecovered)}")
    for failure in v.failures + problems:
        print(f"- FAILED: {failure}")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("session", "lease", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=60.0, help="of faults, per mode")
    parser.add_argument("--minutes", type=float, help="of faults, per mode (instead of --seconds)")
    parser.add_argument("--seed", type=int, help="default: drawn, and printed")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the evidence of a passing run")
    parser.add_argument("--judge", type=Path, help="judge a kept evidence folder again, only")
    args = parser.parse_args()
    if args.judge is not None:
        return 0 if judge(args.judge) else 1
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    modes = ("session", "lease") if args.mode == "both" else (args.mode,)
    ok = True
    for mode in modes:
        evidence = RESULTS / f"{mode}-{seed}"
        passed = asyncio.run(soak(mode, seconds, seed, args.warmup, evidence))
        if passed and not args.keep:
            shutil.rmtree(evidence, ignore_errors=True)
        elif not passed:
            print(
                f"soak {mode} FAILED; evidence in {evidence}; rerun with: python "
                f"benchmarks/soak/run.py --mode {mode} --seconds {seconds:.0f} --seed {seed}"
            )
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
