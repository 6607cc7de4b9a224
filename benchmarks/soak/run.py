"""The nemesis soak: three replicas, a dozen jobs, random faults, one checker.

    nox -s soak                                   # both modes, 60 s of faults each
    nox -s soak -- --minutes 30                   # the long run
    python benchmarks/soak/run.py --mode lease --seconds 60 --seed 1234

Per mode, a throwaway PostgreSQL cluster (tests/postgres/cluster.py, never the machine's
server) with a streaming standby, and, for lease mode, PgBouncer in transaction mode in
front of the primary; per replica a TCP proxy (faultproxy.py) between the replica and the
primary (session) or the pooler (lease), so that a fault hits one replica at a time. The
replicas reach the primary through one endpoint that a failover moves, as a DNS name or a
virtual IP would: the proxies in session mode, PgBouncer in lease mode (servers.py). Three
replica processes (replica.py) run the soak's jobs (lease mode with cronlock's default
lease, 20 s). After a warm-up a seeded nemesis injects one fault at a time, every few
seconds: SIGKILL (the replica is restarted at once), SIGSTOP for 0.5-3.5 s, a partition
of one replica for 1-10 s, a connection reset, a server crash-restart (``pg_ctl restart -m
immediate``), a clock step of 1-5 s on one replica, a ``failover`` (the primary crashes,
the standby is promoted 3 s later and the endpoint moves to it) and a ``switchover`` (the
primary stops cleanly, then the same). One failover and one switchover come at seeded
instants of every run; a new standby is made after each, and while one streams the
random draw may pick them too. Half the faults are followed by a quiet spell until their
window closes, so that slots outside every window are judged too. Then the replicas are
stopped with SIGTERM, the primary's ledger (``cronlock_runs``) is saved, and the checker
(checker.py) judges every slot from the end of the warm-up to the stop.

After the last fault, a quiet spell (``QUIET``, longer than the jobs' misfire grace) lets
every slot owed be run. Then the replicas are stopped with SIGTERM, the primary's ledger
(``cronlock_runs``) is saved, and the checker (checker.py) judges every slot due from the
end of the warm-up to ``JUDGED_QUIET`` seconds into the quiet spell with the simulator's
oracle (``cronlock._sim.oracle``): the same rules as the simulation, no excuses of the
soak's own.

The run fails (exit status 1) on a violation of the oracle whose rule is not a known defect
of today's code under the run's fault kinds (``cronlock._sim.scenarios.known_rules``;
known ones are counted apart as findings), on a ledger row that says a run ran that no
body started, on a replica that did not stop cleanly, or on anything of cronlock's left on
the server afterwards (an advisory lock, a session, a live lease). Evidence (effects files,
replica logs, the servers' logs, the ledger, the faults, the verdict) is kept in
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

from checker import RULES, Fault, Job, Verdict, check, read_effects, read_ledger  # noqa: E402
from cluster import Cluster  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from pgbouncer import PgBouncer  # noqa: E402
from replica import (  # noqa: E402
    HEARTBEAT,
    JOBS,
    KEEPALIVES,
    LEASE,
    MISFIRE_GRACE,
    STATEMENT_TIMEOUT,
)
from servers import Pooler, Servers  # noqa: E402

from cronlock.postgres._conn.backoff import RECONNECT_MAX  # noqa: E402

REPLICAS = 3
MOVES = ("failover", "switchover")
"""The faults that move the primary: only while a standby streams (servers.py)."""
PLANNED = (("failover", (0.1, 0.35)), ("switchover", (0.55, 0.8)))
"""The moves of every run, and when they come (a span of fractions of the run)."""
KINDS = ("kill", "pause", "partition", "reset", "restart", "clock", *MOVES)
HOLDERS = ("kill", "partition", "reset", "restart", *MOVES)
"""Lease mode: the faults that can leave a lease held (a killed or cut-off replica's, or
one taken by a claim whose answer was lost) until it expires."""
SERVER_NOTICE = KEEPALIVES.idle + KEEPALIVES.interval * KEEPALIVES.count  # ~6 s
DETECT = HEARTBEAT + STATEMENT_TIMEOUT
"""Session mode: a replica notices its dead lock session within heartbeat + timeout."""
SLACK = 2.0
LOGIN_RETRY = 2
QUIET = MISFIRE_GRACE + 10.0
"""Seconds of no fault after the last one, before the replicas are stopped: every slot
judged has had its misfire grace to run in ("safety, then liveness")."""
JUDGED_QUIET = 10.0
"""Seconds of the quiet spell whose slots are judged too (after the faults, the fleet
must run every slot on time)."""
"""PgBouncer's ``server_login_retry`` in the soak (its default, 15 s, makes every server
restart cost 15 s of runs through the pooler: docs/guides/poolers.md)."""


def outage_after(kind: str, mode: str) -> float:
    """Seconds after a fault ends by which every replica can reach the server again, from
    the documented bounds: reconnect backoff (``RECONNECT_MAX``), detection of a dead
    session (heartbeat + statement timeout), PgBouncer's login retry after a server went
    away (lease mode), plus slack. A slot whose grace outlasts this is owed a run."""
    server = RECONNECT_MAX + DETECT + (LOGIN_RETRY if mode == "lease" else 0.0)
    return {
        "kill": 0.0,
        "pause": RECONNECT_MAX + DETECT,
        "partition": RECONNECT_MAX + DETECT,
        "reset": RECONNECT_MAX + DETECT,
        "restart": server,
        "clock": 0.0,
        "failover": server,
        "switchover": server,
    }[kind] + SLACK


def window_after(kind: str, mode: str) -> float:
    """Seconds after a fault ends in which it may still cost slots: its outage
    (:func:`outage_after`) and, in lease mode, the lease (a lease held by a killed or
    cut-off replica, or taken by a claim whose answer was lost, must expire first)."""
    lease = LEASE if mode == "lease" and kind in HOLDERS else 0.0
    return outage_after(kind, mode) + lease


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
    """One fault at a time, chosen by a seeded generator, logged as :class:`Fault`; a
    failover and a switchover at seeded instants of every run."""

    def __init__(
        self,
        rng: random.Random,
        mode: str,
        replicas: list[Replica],
        proxies: list[FaultProxy],
        servers: Servers,
    ) -> None:
        self.rng, self.mode = rng, mode
        self.replicas, self.proxies, self.servers = replicas, proxies, servers
        self.faults: list[Fault] = []

    async def run(self, until: float) -> None:
        now = time.time()
        planned = {kind: now + self.rng.uniform(*span) * (until - now) for kind, span in PLANNED}
        while True:
            kind = self.rng.choice(KINDS)
            index = self.rng.randrange(len(self.replicas))
            duration = {"pause": (0.5, 3.5), "partition": (1.0, 10.0)}.get(kind, (0.0, 0.0))
            seconds = self.rng.uniform(*duration)
            step = self.rng.choice((-1, 1)) * self.rng.uniform(1.0, 5.0)
            settle = self.rng.random() < 0.5
            gap = self.rng.uniform(1.0, 4.0)
            other = self.rng.choice([k for k in KINDS if k not in MOVES])
            due = [k for k, at in planned.items() if at <= time.time()]
            if due:
                kind, seconds = due[0], 0.0
                del planned[kind]
                if not await self.servers.wait_ready(timeout=max(0.0, until - time.time())):
                    log(f"planned {kind} not made: no standby")
                    continue
            elif kind in MOVES and not self.servers.ready:
                kind, seconds = other, 0.0  # no standby yet: a fault of another kind
            if time.time() + seconds + 1 >= until:
                return
            fault = await self.inject(kind, index, seconds, step)
            self.faults.append(fault)
            log(f"fault {len(self.faults)}: {fault.kind} {fault.detail}")
            resume = (fault.window_end if settle else fault.end) + gap
            resume = min([resume, *planned.values()])  # a planned move is never put off
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
            target, detail = None, f"of the server (port {self.servers.primary.port})"
            await self.servers.restart()
        elif kind == "clock":
            replica.effects.with_suffix(".jsonl.clock").write_text(f"{step:.3f}")
            replica.signal(signal.SIGUSR1)
            detail += f" to {step:+.1f} s"
        elif kind in MOVES:
            target = None
            detail = await self.servers.fail_over(planned=kind == "switchover")
        end = time.time()
        return Fault(
            kind,
            target,
            start,
            end,
            end + window_after(kind, self.mode),
            pids,
            detail,
            outage_end=end + outage_after(kind, self.mode),
        )


async def save_ledger(cluster: Cluster, path: Path) -> None:
    """Write the ledger's runs table (``cronlock_runs``) as JSON, for the checker: slots in
    ISO 8601, the other times in seconds since the epoch."""
    conn = await asyncpg.connect(cluster.dsn)
    try:
        rows = await conn.fetch(
            """SELECT job, slot, host, pid,
                      extract(epoch FROM started_at)::float8 AS started_at,
                      extract(epoch FROM finished_at)::float8 AS finished_at,
                      outcome, attempt, holder
               FROM cronlock_runs ORDER BY slot, job"""
        )
    finally:
        await conn.close()
    path.write_text(json.dumps([{**row, "slot": row["slot"].isoformat()} for row in rows]))


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
        cluster = stack.enter_context(Cluster())  # and, at exit, every standby made of it
        bouncer = None
        target_port = cluster.port
        if mode == "lease":
            bouncer = stack.enter_context(
                Pooler.for_dsn(
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
        servers = Servers(cluster, proxies, bouncer)
        await servers.start()
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
            nemesis = Nemesis(rng, mode, replicas, proxies, servers)
            await nemesis.run(until=judged_from + seconds)
            await asyncio.sleep(max(0.0, judged_from + seconds - time.time()))
            quiet_from = time.time()
            judged_to = quiet_from + JUDGED_QUIET
            log(f"soak {mode}: faults over; {QUIET:.0f} s of quiet")
            await asyncio.sleep(QUIET)
            for replica in replicas:
                if (problem := await replica.stop()) is not None:
                    problems.append(problem)
            settled = time.time()
            await save_ledger(servers.primary, evidence / "ledger.json")
            problems += await leftovers(servers.primary, bouncer)
        finally:
            for replica in replicas:
                replica.signal(signal.SIGKILL)
            for proxy in proxies:
                await proxy.close()
            await servers.close()
            servers.keep_logs(evidence)
    (evidence / "faults.json").write_text(json.dumps([f.__dict__ for f in nemesis.faults]))
    run = {
        "mode": mode,
        "seed": seed,
        "from": judged_from,
        "to": judged_to,
        "quiet_from": quiet_from,
        "settled": settled,
        "problems": problems,
    }
    (evidence / "run.json").write_text(json.dumps(run))
    return judge(evidence)


def judge(evidence: Path) -> bool:
    """Judge the evidence of a soak (its effects files, faults, ledger and run); True if it
    passed. Writes verdict.json beside it."""
    run = json.loads((evidence / "run.json").read_text())
    faults = [
        Fault(**{**f, "pids": tuple(f["pids"])})
        for f in json.loads((evidence / "faults.json").read_text())
    ]
    records = read_effects(sorted(evidence.glob("effects-*.jsonl")))
    ledger_file = evidence / "ledger.json"
    ledger = read_ledger(ledger_file) if ledger_file.exists() else []
    jobs = [Job(j.name, j.interval, j.duration, j.recover, MISFIRE_GRACE) for j in JOBS]
    verdict = check(
        records,
        faults,
        jobs,
        mode=run["mode"],
        judged_from=run["from"],
        judged_to=run["to"],
        settled=run.get("settled", run["to"]),
        ledger=ledger,
    )
    report(run["seed"], verdict, run["problems"])
    (evidence / "verdict.json").write_text(json.dumps({**run, **verdict.as_dict()}))
    return not (verdict.failures or run["problems"])


def failures_of(evidence: Path) -> list[str]:
    """What failed a judged soak (its verdict's failures and the run's problems), for the
    last line of its output: a CI log cut in the middle still says why."""
    try:
        verdict = json.loads((evidence / "verdict.json").read_text())
    except (OSError, ValueError):
        return ["no verdict: the soak stopped before it was judged"]
    failures = [str(f) for f in [*verdict.get("failures", []), *verdict.get("problems", [])]]
    if len(failures) > 5:
        failures = [*failures[:5], f"... {len(failures) - 5} more"]
    return failures


SHOWN = 10
"""Violations printed per list (all are in verdict.json)."""


def report(seed: int, v: Verdict, problems: list[str]) -> None:
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(v.faults.items())) or "none"
    print(f"## soak, {v.mode} mode, seed {seed}, {v.judged_to - v.judged_from:.0f} s judged")
    kinds = ", ".join(v.kinds)
    print(f"- faults: {sum(v.faults.values())} ({faults}); the simulator's kinds: {kinds}")
    print(f"- known rules under them (cronlock._sim.scenarios): {', '.join(v.allowed) or 'none'}")
    print(
        f"- slots judged: {v.judged.slots}; ran {v.judged.ran}; did not run, with a fate a user "
        f"can see: {v.judged.explained}"
    )
    print(f"- runs: {v.runs} (cancelled {v.cancelled}, killed {v.killed}); not in the ledger: "
          f"{v.unledgered}")  # fmt: skip
    print("- per rule (violations outside the known rules / known (finding)):")
    for rule, (new, known) in v.counts().items():
        mark = "" if new == 0 else "  <- FAILS"
        tag = "" if rule in RULES else " (the soak's own)"
        print(f"  - {rule}{tag}: {new} / {known}{mark}")
    for title, items in (
        ("known (finding)", [x.text() for x in v.known]),
        ("FAILED", [*v.failures, *problems]),
    ):
        for text in items[:SHOWN]:
            print(f"- {title}: {text}")
        if len(items) > SHOWN:
            print(f"- {title}: ... {len(items) - SHOWN} more (verdict.json)")
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
                f"soak {mode} FAILED ({'; '.join(failures_of(evidence))}); evidence in "
                f"{evidence}; rerun with: python benchmarks/soak/run.py --mode {mode} "
                f"--seconds {seconds:.0f} --seed {seed}"
            )
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
