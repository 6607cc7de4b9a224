"""Real Celery beats and workers for the beat tests, and what the workers received.

Every process runs the test app (``celery_proj.py``) as its own process group, its output
in a file of the test's; :meth:`CeleryFleet.stop` kills whatever is left. The brokers are
the machine's Redis (keys under the test's own prefix, removed at the end) or a RabbitMQ
server of the test's own (:class:`PrivateRabbit`: Debian's rabbitmq-server on free ports,
in a temporary directory, always stopped).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cronlock.celery import task_id

from ..eventually import eventually_blocking

REPO = Path(__file__).resolve().parents[2]
APP = "tests.postgres.celery_proj"
READY = "cronlock celery beat:"  # what a beat logs once its scheduler runs

BeatForm = Literal["celery", "cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class CeleryFleet:
    """Beat replicas and workers of one test, all on the queue (and key prefix) ``queue``."""

    def __init__(
        self,
        tmp: Path,
        *,
        broker: str,
        dsn: str,
        mode: str = "session",
        entries: int = 20,
        interval: float = 1.0,
    ) -> None:
        self.tmp = tmp
        self.queue = f"cronlock-celery-{uuid.uuid4().hex[:10]}"
        self.ledger = f"celery_{uuid.uuid4().hex[:10]}"
        self.entries = [f"e{i}" for i in range(entries)]
        self.records = tmp / "records"
        self.records.mkdir(exist_ok=True)
        self._env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
            "PYTHONUNBUFFERED": "1",
            "CRONLOCK_DSN": dsn,
            "CL_BROKER": broker,
            "CL_QUEUE": self.queue,
            "CL_ENTRIES": str(entries),
            "CL_INTERVAL": str(interval),
            "CL_RECORDS": str(self.records),
            "CL_LEDGER": self.ledger,
            "CL_MODE": mode,
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self._started = 0

    def _spawn(self, name: str, args: list[str], **env: str) -> None:
        self._started += 1
        log = self.tmp / f"{name}-{self._started}.log"
        with log.open("wb") as out:
            self.procs[name] = subprocess.Popen(
                args,
                cwd=REPO,
                env={**self._env, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.logs[name] = log

    def beat(self, name: str, form: BeatForm = "celery", metrics_port: int | None = None) -> None:
        """Start a beat replica: ``celery beat -S cronlock.celery.BeatScheduler`` or
        ``python -m cronlock celery-beat`` (serving its metrics on *metrics_port*)."""
        env = {} if metrics_port is None else {"CL_METRICS_PORT": str(metrics_port)}
        if form == "celery":
            args = [sys.executable, "-m", "celery", "-A", APP, "beat"]
            args += ["-S", "cronlock.celery.BeatScheduler", "-l", "info"]
        else:
            args = [sys.executable, "-m", "cronlock", "celery-beat", "-A", APP, "-l", "info"]
        self._spawn(name, args, **env)

    def worker(self, name: str) -> None:
        self._spawn(
            name,
            [
                sys.executable, "-m", "celery", "-A", APP, "worker", "-Q", self.queue,
                "-P", "threads", "-c", "4", "-n", f"{name}-{self.queue}@%h",
                "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning",
            ],
        )  # fmt: skip

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def wait_ready(self, *names: str, timeout: float = 90) -> None:
        for name in names:
            proc = self.procs[name]

            def ready(name: str = name, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited ({proc.returncode}):\n{self.log(name)}")
                return READY in self.log(name)

            eventually_blocking(ready, f"{name} to start", timeout, every=0.2)

    def kill(self, name: str) -> None:
        """``kill -9`` the process."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def terminate(self, name: str, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit (SIGKILL after *timeout*); the exit status."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
                raise AssertionError(f"{name} did not stop on SIGTERM:\n{self.log(name)}") from None
        return proc.returncode

    def stop(self) -> None:
        """Kill every process still running (their groups: a worker's children too)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def received(self) -> list[dict[str, Any]]:
        """Every task the workers executed (one line each), as far as written."""
        found: list[dict[str, Any]] = []
        for path in sorted(self.records.glob("worker-*.jsonl")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
        return found

    def task_id(self, entry: str, slot: float) -> str:
        return task_id(self.ledger, entry, datetime.fromtimestamp(slot, UTC))


@dataclass
class Verdict:
    """What the workers received against the slots due in a window."""

    slots: int = 0  # entry-slots due in the window
    sent: int = 0  # distinct task ids of the window received (each a slot sent)
    deliveries: int = 0  # tasks executed for the window's slots
    sent_twice: list[str] = field(default_factory=list)  # an id sent by two attempts
    delivered_twice: list[str] = field(default_factory=list)  # one send executed twice
    wrong_id: list[dict[str, Any]] = field(default_factory=list)  # id not its slot's
    missing: list[tuple[str, float]] = field(default_factory=list)  # (entry, slot) never sent


def judge(fleet: CeleryFleet, first: float, last: float, interval: float = 1.0) -> Verdict:
    """Compare what the workers received with every slot of every entry in [first, last]."""
    expected: dict[str, tuple[str, float]] = {}
    slot = first
    while slot <= last:
        for entry in fleet.entries:
            expected[fleet.task_id(entry, slot)] = (entry, slot)
        slot += interval
    verdict = Verdict(slots=len(expected))
    by_id: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in fleet.received():
        slot_text = record.get("slot")
        if slot_text is None:
            continue
        at = datetime.fromisoformat(slot_text).timestamp()
        if fleet.task_id(record["entry"], at) != record["id"]:
            verdict.wrong_id.append(record)
        if record["id"] in expected:
            by_id[record["id"]].append(record)
    for tid, records in by_id.items():
        verdict.deliveries += len(records)
        sends = collections.Counter(r["send"] for r in records)  # a random id per send
        if len(sends) > 1:
            verdict.sent_twice.append(tid)
        if any(n > 1 for n in sends.values()):
            verdict.delivered_twice.append(tid)
    verdict.sent = len(by_id)
    verdict.missing = sorted(v for k, v in expected.items() if k not in by_id)
    return verdict


# -- a RabbitMQ server of the test's own -------------------------------------------------

RABBIT_BIN = "/usr/lib/rabbitmq/bin"


class RabbitUnavailable(RuntimeError):
    """Debian's rabbitmq-server is not installed here."""


class PrivateRabbit:
    """Debian's rabbitmq-server as a node of its own (name, ports, data, logs, cookie in a
    temporary directory), never the machine's: started by :meth:`start`, always stopped
    (and its directory removed) by :meth:`stop`."""

    def __init__(self) -> None:
        if not os.path.exists(f"{RABBIT_BIN}/rabbitmq-server"):
            raise RabbitUnavailable(
                f"no {RABBIT_BIN}/rabbitmq-server (apt-get install rabbitmq-server)"
            )
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="cronlock-rabbit-"))
        self.node = f"cronlock{self.port}@localhost"
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.root / "enabled_plugins").write_text("[].\n")  # no management listener
        (self.root / "env.conf").write_text("")  # not /etc/rabbitmq/rabbitmq-env.conf
        self.env = {
            **os.environ,
            "HOME": str(self.root),  # the Erlang cookie
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_PID_FILE": str(self.root / "pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self, timeout: float = 90) -> None:
        with (self.root / "server.log").open("wb") as out:
            self.proc = subprocess.Popen(
                [f"{RABBIT_BIN}/rabbitmq-server"],
                cwd=self.root,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def listening() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    "rabbitmq-server exited:\n" + (self.root / "server.log").read_text()[-3000:]
                )
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        eventually_blocking(listening, "rabbitmq-server to listen", timeout, every=0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [f"{RABBIT_BIN}/rabbitmqctl", "-n", self.node, "stop"],
                    env=self.env,
                    capture_output=True,
                    timeout=60,
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        if self.proc is not None:
            # The whole group, whatever is left of it: the Erlang VM and its helpers.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)
