"""For the tests that run a real multi-worker server (``uvicorn --workers 3``): each answer
names the worker process that gave it (``x-worker-pid``), so a test can tell which worker
a request reached, and :func:`uvicorn_workers` starts such a server and stops it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .postgres.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
STARTUP_BOUND = 120.0  # only stops a hang; reaching it is a failure


def pid_marked(inner: ASGIApp) -> ASGIApp:
    """*inner*, each response carrying an ``x-worker-pid`` header."""
    pid = str(os.getpid()).encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-worker-pid", pid)]}
            await send(message)

        await inner(scope, receive, marked)

    return app


async def get(base: str, path: str, **options: Any) -> httpx.Response:
    """GET on a fresh connection, so that requests spread over the workers."""
    async with httpx.AsyncClient(base_url=base) as fresh:
        return await fresh.get(path, **options)


@contextlib.asynccontextmanager
async def uvicorn_workers(
    app: str, env: Mapping[str, str], *, workers: int, probe: str
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """(base URL, server process) of ``uvicorn APP --workers N``, once every worker has
    answered a GET of *probe*; at the end, SIGTERM, and no traceback in its stderr."""
    port = free_port()
    environ = {**os.environ, **env}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    command = [sys.executable, "-m", "uvicorn", app, "--workers", str(workers)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(STARTUP_BOUND):
            pids: set[str] = set()
            while len(pids) < workers:  # every worker answers before the test starts
                try:
                    pids.add((await get(base, probe)).headers["x-worker-pid"])
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
        yield base, server
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    assert "Traceback" not in stderr.decode(), stderr.decode()
