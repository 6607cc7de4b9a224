"""Celery beat side by side (issue 39): stock ``celery beat`` twice, RedBeat twice with the
active one killed, cronlock's beat three times with one killed and restarted.

    python benchmarks/celery_beat.py [--seconds 60]
        [--rows stock,redbeat,redbeat-1s,cronlock,cronlock-lease] [--entries 15]
        [--cron-entries 3] [--cronlock-src PATH [--cronlock-rev COMMIT]] [--write]

Celery, kombu, RedBeat and redis-py run in a virtualenv of their own,
benchmarks/.venvs/celery, made on first use from benchmarks/requirements-celery.txt (with
cronlock's own dependencies; cronlock itself is imported from ``--cronlock-src``, by
default this checkout's src/, or from that directory as of commit ``--cronlock-rev``,
exported to the temporary directory). The driver needs asyncpg and psutil.

Every row runs the same throwaway Celery app (written to a temporary directory): *entries*
entries every second (``schedule(1.0)``) and *cron-entries* ``crontab()`` entries (every
minute), each sending the task ``bench.tick`` with its entry's name; broker Redis
(``--redis``, else ``CRONLOCK_BENCH_REDIS``, else 127.0.0.1:6379) with every key of the
run under a prefix of its own (kombu's ``global_keyprefix``, RedBeat's
``redbeat_key_prefix``), deleted at the end. One ``celery worker`` (solo pool) takes the
run's queue and appends every task it receives to a file: task id, entry, receive time,
and two headers each beat process stamps on the message as it publishes it
(``before_task_publish``): the publishing beat's name and its ``time.time()``. Every
figure below is counted from the publish times of what the worker received.

Rows (the beats start together once the worker is ready; the window opens 4 s later and
lasts *seconds*):

- ``stock``: ``celery beat`` x2, the default ``PersistentScheduler``, a schedule file each.
  No kill: nothing stops the second from sending everything too.
- ``redbeat``: ``celery beat -S redbeat.RedBeatScheduler`` x2, RedBeat's settings left at
  their defaults (``redbeat_lock_timeout`` unset: 5 x ``beat_max_loop_interval``, whose
  default is 300 s for this scheduler: a 1,500 s lock, and the standby tries for it every
  300 s). The active beat (the one sending) is killed (SIGKILL) a third into the window.
- ``redbeat-1s``: the same with ``beat_max_loop_interval = 1``: a 5 s lock, retried every
  second.
- ``cronlock``: ``celery beat -S cronlock.celery.BeatScheduler`` x3, ``cronlock_dsn``
  (``--dsn``, else ``CRONLOCK_BENCH_DSN``, else ``postgresql://postgres@127.0.0.1:5432/test``)
  and a ledger of the run's own, in a schema of its own dropped at the end, session mode.
  The beat that sent last is killed a third into the window and started again 10 s later.
- ``cronlock-lease``: the same in lease mode (``cronlock_mode = "lease"``).

Counting (``tally``), per entry, over the sends published in the window:

- A send that names its slot (cronlock's beat: the ``cronlock_slot`` header) is counted
  in that slot; *missed* are the slots in the window with no send.
- Otherwise, an entry every *I* seconds: celery's ``schedule(I)`` counts from the last
  send, so its slots are not on a grid, and a beat sends a little less often than every
  *I* s (the time it takes to send is added to each period). A send's slot is its publish
  time floored to *I*: *duplicates*
  are the sends beyond the first in a slot, *sent* the slots with a send. *Missed* comes
  from the gaps between an entry's consecutive sends (and from the window's edges to its
  first and last): a gap of *g* intervals (rounded) holds *g* - 1 missed slots, so the
  drift of an undisturbed beat (gaps of 1.0x I) counts as none. *Due* is the window's
  length over *I*, so *sent* + *missed* may fall short of it by that drift. Limits: two
  beats sending the same entry within one *I*-wide slot count as one slot sent twice,
  sends of two beats that straddle a slot's boundary as two slots; a beat's catch-up send
  after a gap (celery sends an overdue entry once) counts as one slot.
- A ``crontab()`` entry: its slot is the minute of its send; due are the minutes that
  begin in the window; a minute with no send is missed.
- *Takeover* (rows with a kill): from the killed beat's last send to the first send of
  another beat after it. *Longest gap*: the longest time between two consecutive sends
  of one entry every *I* s, from its last send before the kill to the window's end.
- *Ids sent twice*: task ids the worker received more than once (cronlock's beat derives a
  slot's task id from the ledger, the entry and the slot).

Prints one Markdown table (and the JSON behind it to benchmarks/results/celery-beat.json);
``--write`` puts the table between the ``celery-beat`` markers in benchmarks/README.md.
Processes, Redis keys, the schema and the temporary directory are removed at the end,
also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
MARKERS = ("<!-- celery-beat:start -->", "<!-- celery-beat:end -->")
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
WARMUP_S = 4.0
RESTART_AFTER_S = 10.0

APP = '''\
"""The throwaway app of benchmarks/celery_beat.py (configured from the environment)."""

import json
import os
import time

from celery import Celery
from celery.schedules import crontab
from celery.signals import before_task_publish

RUN = os.environ["BENCH_RUN"]
app = Celery("beatbench", broker=os.environ["BENCH_BROKER"])
schedule = {
    f"e{i:02d}": {"task": "bench.tick", "schedule": 1.0, "kwargs": {"entry": f"e{i:02d}"}}
    for i in range(int(os.environ["BENCH_ENTRIES"]))
}
schedule.update(
    {
        f"c{i}": {"task": "bench.tick", "schedule": crontab(), "kwargs": {"entry": f"c{i}"}}
        for i in range(int(os.environ["BENCH_CRON_ENTRIES"]))
    }
)
app.conf.update(
    task_default_queue=f"{RUN}-q",
    broker_transport_options={"global_keyprefix": f"{RUN}:"},
    broker_connection_retry_on_startup=True,
    worker_enable_remote_control=False,
    task_ignore_result=True,
    timezone="UTC",
    enable_utc=True,
    beat_schedule=schedule,
)
app.conf.update(json.loads(os.environ.get("BENCH_CONF", "{}")))


@before_task_publish.connect
def _stamp(headers=None, **_):
    if headers is not None:
        headers["bench_sent_at"] = time.time()
        headers["bench_beat"] = os.environ.get("BENCH_BEAT", "?")


@app.task(name="bench.tick", bind=True)
def tick(self, entry):
    line = {
        "id": self.request.id,
        "entry": entry,
        "received": time.time(),
        "sent_at": getattr(self.request, "bench_sent_at", None),
        "beat": getattr(self.request, "bench_beat", None),
        "slot": getattr(self.request, "cronlock_slot", None),
    }
    fd = os.open(os.environ["BENCH_RECORDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(line) + "\\n").encode())
    finally:
        os.close(fd)
'''


@dataclass(frozen=True)
class Send:
    """One task the worker received: which entry, published when and by which beat."""

    entry: str
    sent_at: float
    beat: str
    task_id: str
    slot: float | None = None
    """The slot the sender says the task is for (cronlock's ``cronlock_slot`` header)."""


@dataclass
class Tally:
    """What one row's sends come to (see the module's docstring for each figure)."""

    due: int = 0
    sends: int = 0
    sent: int = 0
    duplicates: int = 0
    missed: int = 0
    ids_twice: int = 0
    takeover_s: float | None = None
    longest_gap_s: float | None = None
    per_beat: dict[str, int] = field(default_factory=dict)
    period_s: float | None = None


def _when(send: Send) -> float:
    """The instant a send is counted at: its slot when the sender says it, else its
    publish time."""
    return send.sent_at if send.slot is None else send.slot


def tally(
    sends: Iterable[Send],
    intervals: Mapping[str, float | None],
    start: float,
    end: float,
    kill: tuple[float, str] | None = None,
) -> Tally:
    """Count *sends* published in [*start*, *end*) against *intervals* (entry -> seconds,
    ``None`` for an every-minute crontab). *kill* is (when, which beat) for rows with one."""
    inside = [s for s in sends if start <= _when(s) < end]
    out = Tally(sends=len(inside))
    out.per_beat = dict(sorted(Counter(s.beat for s in inside).items()))
    out.ids_twice = sum(n - 1 for n in Counter(s.task_id for s in inside).values() if n > 1)
    by_entry: dict[str, list[Send]] = defaultdict(list)
    for s in inside:
        by_entry[s.entry].append(s)
    periods: list[float] = []
    for entry, interval in intervals.items():
        own = sorted(by_entry.get(entry, []), key=lambda s: s.sent_at)
        step = 60.0 if interval is None else interval
        due = range(math.ceil(start / step), math.ceil(end / step))
        counts = Counter(int(_when(s) // step) for s in own)
        out.due += len(due)
        out.sent += sum(1 for k in due if counts[k])
        out.duplicates += sum(counts[k] - 1 for k in due if counts[k] > 1)
        if interval is None or all(s.slot is not None for s in own):
            out.missed += sum(1 for k in due if not counts[k])
        else:  # slots not on a grid: count the gaps between consecutive sends
            edges = [start, *(s.sent_at for s in own), end]
            for a, b in pairwise(edges):
                out.missed += max(0, round((b - a) / interval) - 1)
        if interval is not None:
            beats: dict[str, list[float]] = defaultdict(list)
            for s in own:
                beats[s.beat].append(s.sent_at)
            for times in beats.values():
                periods += [b - a for a, b in pairwise(times) if b - a < 1.5 * interval]
    if periods:
        out.period_s = sum(periods) / len(periods)
    if kill is not None:
        at, victim = kill
        before = [s.sent_at for s in inside if s.beat == victim and s.sent_at <= at]
        after = [s.sent_at for s in inside if s.beat != victim and s.sent_at > at]
        if before and after:
            out.takeover_s = min(after) - max(before)
        gaps: list[float] = []
        for entry, interval in intervals.items():
            if interval is None:
                continue
            times = sorted(s.sent_at for s in by_entry.get(entry, []))
            last = max((t for t in times if t <= at), default=start)
            tail = [last, *(t for t in times if t > at), end]
            gaps += [b - a for a, b in pairwise(tail)]
        out.longest_gap_s = max(gaps) if gaps else None
    return out


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: str
    contender: str
    replicas: int
    kill: str  # "no", "kill", "kill + restart"
    scheduler: str | None
    conf: dict[str, Any]
    settings: str


def rows(run: str, redis_url: str, dsn: str, schema: str, ledger: str) -> dict[str, Row]:
    def redbeat(key: str) -> dict[str, Any]:  # a killed beat's lock outlives its row
        return {"redbeat_redis_url": redis_url, "redbeat_key_prefix": f"{run}:{key}:redbeat"}

    return {
        "stock": Row(
            "stock",
            "celery beat (PersistentScheduler)",
            2,
            "no",
            None,
            {},
            "a schedule file each",
        ),
        "redbeat": Row(
            "redbeat",
            "RedBeat 2.3.2, defaults",
            2,
            "kill",
            "redbeat.RedBeatScheduler",
            redbeat("redbeat"),
            "lock 1,500 s (5 x max interval 300 s), retried every 300 s",
        ),
        "redbeat-1s": Row(
            "redbeat-1s",
            "RedBeat 2.3.2, beat_max_loop_interval=1",
            2,
            "kill",
            "redbeat.RedBeatScheduler",
            {**redbeat("redbeat-1s"), "beat_max_loop_interval": 1},
            "lock 5 s (5 x max interval 1 s), retried every 1 s",
        ),
        "cronlock": Row(
            "cronlock",
            "cronlock.celery.BeatScheduler",
            3,
            "kill + restart",
            "cronlock.celery.BeatScheduler",
            {"cronlock_dsn": dsn, "cronlock_ledger": ledger, "cronlock_schema": schema},
            "session mode, the other settings the defaults",
        ),
        "cronlock-lease": Row(
            "cronlock-lease",
            "cronlock.celery.BeatScheduler, lease mode",
            3,
            "kill + restart",
            "cronlock.celery.BeatScheduler",
            {
                "cronlock_dsn": dsn,
                "cronlock_ledger": f"{ledger}_lease",
                "cronlock_schema": schema,
                "cronlock_mode": "lease",
            },
            "lease mode, the other settings the defaults",
        ),
    }


class Interrupted(BaseException):
    """SIGTERM while running: unwinds like Ctrl-C so that everything is cleaned up."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signum}")


class Fleet:
    """The processes of one row: started here, always ended here (by their own pids)."""

    def __init__(self, python: str, tmp: Path, env: dict[str, str]) -> None:
        self.python = python
        self.tmp = tmp
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ended: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: Sequence[str], extra: Mapping[str, str]) -> None:
        log = (self.tmp / f"{name}.out").open("ab")
        try:
            proc = subprocess.Popen(
                [self.python, "-m", "celery", "-A", "beatbench_app", *args],
                cwd=self.tmp,
                env={**self.env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        if name in self.procs:
            self.ended.append(self.procs[name])
        self.procs[name] = proc

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, names: Iterable[str] | None = None) -> None:
        chosen = [self.procs[n] for n in (names or list(self.procs))]
        for proc in chosen:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in chosen:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def close(self) -> None:
        for proc in [*self.procs.values(), *self.ended]:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def tail(self, name: str, chars: int = 1500) -> str:
        path = self.tmp / f"{name}.out"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def read_sends(path: Path) -> list[Send]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("sent_at") is None:
            continue
        slot = rec.get("slot")
        at = datetime.fromisoformat(slot).timestamp() if slot else None
        out.append(Send(rec["entry"], rec["sent_at"], rec["beat"] or "?", rec["id"], at))
    return out


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def run_row(
    row: Row, args: argparse.Namespace, python: str, run: str, tmp: Path, env: dict[str, str]
) -> dict[str, Any]:
    records = tmp / f"{row.key}.jsonl"
    env = {**env, "BENCH_RECORDS": str(records), "BENCH_CONF": json.dumps(row.conf)}
    fleet = Fleet(python, tmp, env)
    beats = [chr(ord("A") + i) for i in range(row.replicas)]
    kill: tuple[float, str] | None = None
    try:
        fleet.start(
            f"{row.key}-worker",
            [
                "worker",
                "-P",
                "solo",
                "-Q",
                f"{run}-q",
                "-n",
                f"{run}-{row.key}@bench",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
            {},
        )
        try:
            wait_for(lambda: "ready" in fleet.tail(f"{row.key}-worker"), 60, "the worker")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{fleet.tail(f'{row.key}-worker')}") from None

        def beat(name: str) -> None:
            cmd = ["beat", "-l", "INFO", "--pidfile", str(tmp / f"{row.key}-{name}.pid")]
            cmd += ["-s", str(tmp / f"{row.key}-{name}.schedule")]
            if row.scheduler:
                cmd += ["-S", row.scheduler]
            fleet.start(f"{row.key}-{name}", cmd, {"BENCH_BEAT": name})

        for name in beats:
            beat(name)
        start = float(math.ceil(time.time() + WARMUP_S))  # whole seconds: whole slots
        end = start + round(args.seconds)
        kill_at = start + args.seconds / 3
        while time.time() < kill_at:
            time.sleep(0.2)
            for name in beats:
                if fleet.procs[f"{row.key}-{name}"].poll() is not None:
                    raise RuntimeError(f"beat {name} ended:\n{fleet.tail(f'{row.key}-{name}')}")
        if row.kill != "no":
            recent = [s for s in read_sends(records) if s.sent_at > time.time() - 3]
            if not recent:
                raise RuntimeError("no beat sent anything in the last 3 s before the kill")
            victim = max(recent, key=lambda s: s.sent_at).beat
            fleet.kill(f"{row.key}-{victim}")
            kill = (time.time(), victim)
            if row.kill == "kill + restart":
                time.sleep(RESTART_AFTER_S)
                beat(victim)
        while time.time() < end + 0.5:
            time.sleep(0.2)
        fleet.stop([f"{row.key}-{name}" for name in beats])
        seen = -1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the worker drains the queue
            now = len(read_sends(records))
            if now == seen:
                break
            seen = now
            time.sleep(2)
        fleet.stop()
    finally:
        fleet.close()
    intervals: dict[str, float | None] = {f"e{i:02d}": 1.0 for i in range(args.entries)}
    intervals.update({f"c{i}": None for i in range(args.cron_entries)})
    sends = read_sends(records)
    result = tally(sends, intervals, start, end, kill)
    late = sorted(
        rec["received"] - rec["sent_at"]
        for rec in map(json.loads, records.read_text().splitlines())
        if rec.get("sent_at") is not None
    )
    ids = None
    if row.key.startswith("cronlock"):
        ledger = f"{row.conf['cronlock_schema']}.{row.conf['cronlock_ledger']}"
        ids = check_ids(python, env, ledger, records)
    return {
        "ids_derived": ids,
        "row": asdict(row) | {"conf": {k: v for k, v in row.conf.items() if "url" not in k}},
        "window": [start, end],
        "kill": kill,
        "tally": asdict(result),
        "receive_lag_p99_s": late[int(0.99 * (len(late) - 1))] if late else None,
    }


DELETE_KEYS = """
import sys, redis
client = redis.Redis.from_url(sys.argv[1])
keys = list(client.scan_iter(match=sys.argv[2] + "*", count=1000))
if keys:
    client.delete(*keys)
print(len(keys))
"""


def delete_keys(python: str, redis_url: str, run: str) -> int:
    """Delete the run's Redis keys (with the benchmark's virtualenv's client): how many."""
    done = subprocess.run(
        [python, "-c", DELETE_KEYS, redis_url, run],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


CHECK_IDS = """
import json, sys
from datetime import datetime
from cronlock.celery import task_id
ledger, path = sys.argv[1], sys.argv[2]
same = total = 0
for line in open(path):
    rec = json.loads(line)
    if rec.get("slot"):
        total += 1
        same += rec["id"] == task_id(ledger, rec["entry"], datetime.fromisoformat(rec["slot"]))
print(json.dumps([same, total]))
"""


def check_ids(python: str, env: Mapping[str, str], ledger: str, records: Path) -> list[int]:
    """How many of the tasks received with a slot header carry the id
    ``cronlock.celery.task_id`` gives their (ledger, entry, slot), of how many."""
    done = subprocess.run(
        [python, "-c", CHECK_IDS, ledger, str(records)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=dict(env),
    )
    counts: list[int] = json.loads(done.stdout)
    return counts


def postgres(dsn: str, statement: str) -> None:
    import asyncio

    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(go())


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


VERSIONS = """
from importlib.metadata import version
print(", ".join(f"{n} {version(n)}" for n in ("celery", "kombu", "celery-redbeat", "redis")))
"""


def versions(python: str, commit: str) -> str:
    """The peers' versions, and the commit cronlock was imported from."""
    done = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, timeout=60)
    return f"{done.stdout.strip()}; cronlock at {commit}"


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)
    return done.stdout.decode().strip() if done.returncode == 0 else ""


def cronlock_source(src: Path, rev: str | None, tmp: Path) -> tuple[Path, str]:
    """Where the beats import cronlock from, and which commit that is: *src* as it is on
    disk, or (*rev* given) *src* as of commit *rev* of its repository, exported to *tmp*
    (so that a checkout being edited meanwhile changes nothing)."""
    if rev is None:
        commit = _git(src, "rev-parse", "--short", "HEAD") or "?"
        if _git(src, "status", "--porcelain", "--", "."):
            commit += " with changes not committed"
        return src, commit
    top = Path(_git(src, "rev-parse", "--show-toplevel"))
    inside = src.relative_to(top).as_posix()
    archive = subprocess.run(
        ["git", "-C", str(top), "archive", "--format=tar", rev, "--", inside],
        capture_output=True,
        check=True,
        timeout=120,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp / "cronlock-src", filter="data")
    return tmp / "cronlock-src" / inside, _git(top, "rev-parse", "--short", rev)


def table(
    results: Sequence[dict[str, Any]], seconds: float, entries: int, cron: int, about: str = ""
) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{seconds:g} s a row, {entries} entries every second and {cron} every minute "
        f"(`crontab()`), one worker; {about}; {when}.",
        "",
        "| contender | replicas | kill | slots due | sends | slots sent | duplicates | "
        "missed | takeover s | longest gap s | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for res in results:
        row, t = res["row"], res["tally"]
        notes = [row["settings"]]
        notes.append("sends per beat " + " / ".join(f"{k} {v}" for k, v in t["per_beat"].items()))
        if res["kill"]:
            notes.append(f"killed {res['kill'][1]}")
        if t["period_s"]:
            notes.append(f"a beat's period {t['period_s']:.3f} s")
        if t["ids_twice"]:
            notes.append(f"ids received twice {t['ids_twice']}")
        if res.get("ids_derived"):
            same, total = res["ids_derived"]
            notes.append(f"{same:,} of {total:,} task ids = task_id(ledger, entry, slot)")
        lines.append(
            f"| {row['contender']} | {row['replicas']} | {row['kill']} | {t['due']:,} | "
            f"{t['sends']:,} | {t['sent']:,} | {t['duplicates']:,} | {t['missed']:,} | "
            f"{fmt(t['takeover_s'])} | {fmt(t['longest_gap_s'])} | {'; '.join(notes)} |"
        )
    return "\n".join(lines)


def write_readme(text: str, readme: Path = README) -> None:
    """Put *text* between the ``celery-beat`` markers of *readme*."""
    body = readme.read_text()
    start, end = MARKERS
    head, found, rest = body.partition(start)
    if not found:
        raise RuntimeError(f"{readme} has no {start} marker")
    _, _, tail = rest.partition(end)
    readme.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rows", default="stock,redbeat,redbeat-1s,cronlock,cronlock-lease")
    parser.add_argument("--entries", type=int, default=15)
    parser.add_argument("--cron-entries", type=int, default=3)
    parser.add_argument(
        "--redis", default=os.environ.get("CRONLOCK_BENCH_REDIS") or "127.0.0.1:6379"
    )
    parser.add_argument("--dsn", default=os.environ.get("CRONLOCK_BENCH_DSN") or DEFAULT_DSN)
    parser.add_argument(
        "--cronlock-src",
        type=Path,
        default=HERE.parent / "src",
        help="where cronlock is imported from in the cronlock row (default: this checkout)",
    )
    parser.add_argument(
        "--cronlock-rev", default=None, help="import cronlock as of this commit of its source"
    )
    parser.add_argument("--write", action="store_true", help="update benchmarks/README.md")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "celery-beat.json")
    args = parser.parse_args()
    run = f"cronlock-beatbench-{uuid.uuid4().hex[:8]}"
    redis_url = f"redis://{args.redis}/0"
    schema = f"cronlock_bench_beat_{uuid.uuid4().hex[:8]}"
    ledger = f"beat_{uuid.uuid4().hex[:8]}"
    chosen = rows(run, redis_url, args.dsn, schema, ledger)
    wanted = [chosen[k] for k in args.rows.split(",")]
    from run import venv_python  # here: the counting above imports without psutil

    signal.signal(signal.SIGTERM, _on_term)
    python = venv_python("celery")
    results = []
    failed: list[str] = []
    made_schema = False
    with tempfile.TemporaryDirectory(prefix="beatbench-") as name:
        tmp = Path(name)
        (tmp / "beatbench_app.py").write_text(APP)
        src, commit = cronlock_source(args.cronlock_src.resolve(), args.cronlock_rev, tmp)
        env = dict(os.environ)
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(p for p in (str(tmp), str(src)) if p),
                "BENCH_RUN": run,
                "BENCH_BROKER": redis_url,
                "BENCH_ENTRIES": str(args.entries),
                "BENCH_CRON_ENTRIES": str(args.cron_entries),
            }
        )
        try:
            for row in wanted:
                if row.key.startswith("cronlock") and not made_schema:
                    postgres(args.dsn, f'CREATE SCHEMA "{schema}"')
                    made_schema = True
                print(f"{row.key}: {args.seconds:g} s ...", file=sys.stderr, flush=True)
                try:
                    res = run_row(row, args, python, run, tmp, env)
                except Exception as exc:  # the other rows still run; the table says so
                    print(f"{row.key} failed: {exc}", file=sys.stderr, flush=True)
                    failed.append(f"{row.key}: {str(exc).splitlines()[0]}")
                    continue
                results.append(res)
                print(f"{row.key}: {json.dumps(res['tally'])}", file=sys.stderr, flush=True)
        finally:
            deleted = delete_keys(python, redis_url, run)
            print(f"deleted {deleted} Redis keys", file=sys.stderr, flush=True)
            if made_schema:
                postgres(args.dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    about = versions(python, commit)
    text = table(results, args.seconds, args.entries, args.cron_entries, about)
    text += "".join(f"\n\nNot measured: {line}" for line in failed)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    if args.write:
        write_readme(text)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
