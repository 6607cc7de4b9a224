"""Replica processes that print JSON lines, for the tests that run a fleet of them."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any


class Processes:
    """Child processes running a replica script, and every JSON line they printed."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.procs: list[asyncio.subprocess.Process] = []
        self.lines: list[dict[str, Any]] = []
        self._readers: list[asyncio.Task[None]] = []

    async def spawn(self, *args: str, stdin: bool = False) -> None:
        """Start ``python SCRIPT ARGS``; its lines are read as they come. With *stdin*, its
        standard input is a pipe for :meth:`tell`."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(self.script),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin else None,
            stdout=asyncio.subprocess.PIPE,
        )
        self.procs.append(proc)
        self._readers.append(asyncio.create_task(self._read(proc)))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            self.lines.append(json.loads(line))

    async def tell(self, line: str) -> None:
        """Write *line* to every process's standard input, and close it."""
        for proc in self.procs:
            assert proc.stdin is not None, "spawned without stdin=True"
            proc.stdin.write(f"{line}\n".encode())
            await proc.stdin.drain()
            proc.stdin.close()

    async def stop(self) -> None:
        """Kill every process still running and wait for them and their readers."""
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
        for proc in self.procs:
            await proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)
