"""A real uvicorn serving :mod:`tests.web.gate_app` in a process of its own, for the tests
that need real HTTP: request bodies streamed over a socket, the server's memory, its
database sessions, its log."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..eventually import eventually
from ..multiworker import ROOT, STARTUP_BOUND
from ..postgres.conftest import free_port


@dataclass(frozen=True)
class Served:
    base: str
    port: int
    pid: int
    log: Path

    def memory(self, field: str = "VmHWM") -> int:
        """The server process's *field* of /proc/PID/status in bytes (VmHWM: the peak
        resident size so far; VmRSS: now)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc/{self.pid}/status")


@contextlib.asynccontextmanager
async def served(env: Mapping[str, str], *, crashes: bool = False) -> AsyncIterator[Served]:
    """The gate app under uvicorn, once it answers; stopped (SIGTERM) at the end. Its
    log shows no traceback, unless *crashes* (the test makes it fail on purpose)."""
    port = free_port()
    environ = {**os.environ, **env}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    log = Path(tempfile.mkstemp(prefix="cronlock-web-", suffix=".log")[1])
    command = [sys.executable, "-m", "uvicorn", "tests.web.gate_app:app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with log.open("wb") as errors:
        server = subprocess.Popen(
            command, cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=errors
        )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base) as client:

            async def answers() -> bool:
                try:
                    return (await client.get("/static/live.js")).status_code == 200
                except httpx.TransportError:
                    return False  # not listening yet

            await eventually(answers, "the dashboard server to answer", STARTUP_BOUND, every=0.1)
        yield Served(base, port, server.pid, log)
    finally:
        server.terminate()
        server.wait(timeout=60)
        text = log.read_text()
        log.unlink()
    assert crashes or "Traceback" not in text, text
