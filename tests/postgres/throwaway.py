"""What the throwaway servers of the tests share: cluster.py's PostgreSQL clusters and
pgbouncer.py's poolers must never outlive the test run, even a pytest killed by SIGKILL.

- Each lives in a directory of its own under the temporary directory, with an *owner* file
  (pid and start time of the process it belongs to: a reused pid cannot pass for it).
- A **watchdog** process holds the read end of a pipe whose write end only the owner holds;
  at end-of-file (the owner exited or was killed) it disposes of the server, unless the
  owner wrote :data:`DONE` first (it stopped the server itself).
- The first start in a process **sweeps** the directories whose owner is gone, in case a
  watchdog died too (:func:`orphans`).

Only the standard library is imported here: the watchdogs run these files as scripts.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

__all__ = (
    "DONE",
    "OWNER_FILE",
    "free_port",
    "orphans",
    "run_as_postgres",
    "spawn_watchdog",
    "start_time",
    "watch",
    "write_owner",
)

OWNER_FILE = "owner"  # "<pid> <start time>" of the process the server belongs to
DONE = b"q"  # the owner stopped the server itself: the watchdog just leaves


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_time(pid: int) -> str | None:
    """The start time of process *pid* (clock ticks since boot); ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    if fields[0] == "Z":
        return None  # a zombie has exited: only its exit status is left to collect
    return fields[19]


def run_as_postgres(unavailable: type[Exception], what: str) -> str | None:
    """``"postgres"`` when running as root (the servers refuse root), else ``None``."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise unavailable(f"running as root and there is no 'postgres' user {what}") from None
    return "postgres"


def write_owner(root: str, run_as: str | None) -> None:
    """Say that *root* belongs to this process (and hand it to *run_as*)."""
    with open(os.path.join(root, OWNER_FILE), "w") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
    if run_as is not None:
        shutil.chown(root, user=run_as)


def orphans(prefix: str) -> list[str]:
    """The directories ``<tmp>/<prefix>*`` whose owner is gone (not those of a live run)."""
    found: list[str] = []
    for root in glob.glob(os.path.join(tempfile.gettempdir(), prefix + "*")):
        try:
            with open(os.path.join(root, OWNER_FILE)) as f:
                pid_text, started = f.read().split()
        except (OSError, ValueError):
            continue  # not made by us (or not yet written): not ours to judge
        if start_time(int(pid_text)) != started:
            found.append(root)
    return found


def spawn_watchdog(script: str, args: Sequence[str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``python <script> --watch <fd> <args...>``; return it and the pipe's write end,
    which the owner keeps (closing it, or dying, tells the watchdog)."""
    read, write = os.pipe()  # both ends non-inheritable: no other child holds them
    try:
        proc = subprocess.Popen(
            [sys.executable, script, "--watch", str(read), *args],
            pass_fds=(read,),
            start_new_session=True,  # out of reach of the terminal's Ctrl-C
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    return proc, write


class _Terminated(Exception):
    pass


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def watch(fd: int, dispose: Callable[[], None]) -> None:
    """The watchdog: wait for the owner to go, then *dispose* of its server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # SIGTERM (someone cleaning up processes): dispose of the server too, then exit.
    signal.signal(signal.SIGTERM, _terminated)
    told = b""
    try:
        # End of file once every write end is closed: the owner is done, or dead.
        while chunk := os.read(fd, 64):
            told += chunk
    except _Terminated:
        told = b""
    if DONE not in told:
        dispose()
