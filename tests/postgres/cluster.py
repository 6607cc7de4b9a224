"""A throwaway PostgreSQL cluster that a test may stop, restart and crash.

Never the machine's shared server: :class:`Cluster` makes its own with the local
``initdb``/``pg_ctl`` in ``/tmp/cronlock-pg-*`` (as the ``postgres`` user when running as
root) and removes it when stopped for good. It must not outlive the test run, even when
pytest is killed without a chance to run its finalizers:

- each cluster has a **watchdog**, a small process of its own (this file, run as a
  script) holding the read end of a pipe whose write end only the owning process holds.
  When the owner exits or is killed (SIGKILL included) the pipe reports end-of-file, and
  the watchdog stops the cluster (``pg_ctl -m immediate stop``) and removes its directory.
  It runs in a session of its own, so a Ctrl-C meant for pytest does not reach it.
- the first start in a process **sweeps** ``/tmp/cronlock-pg-*`` for clusters whose owner
  (recorded with its start time, against pid reuse) is gone, in case a watchdog was killed
  too. Directories without an owner file are somebody else's and left alone.

Only the standard library is imported here, so the watchdog starts quickly.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import Literal

try:
    from . import throwaway
except ImportError:  # run as a script (the watchdog): its folder is on sys.path
    import throwaway  # type: ignore[no-redef,import-not-found]

__all__ = (
    "PREFIX",
    "Cluster",
    "ClusterUnavailable",
    "Mode",
    "local_binaries",
    "postmaster_pid",
    "sweep",
)

PREFIX = "cronlock-pg-"

Mode = Literal["smart", "fast", "immediate"]


class ClusterUnavailable(RuntimeError):
    """No local PostgreSQL binaries (or no user to run them as): no cluster can be made."""


def local_binaries() -> str | None:
    """The directory of the newest local ``initdb``/``pg_ctl``, or ``None``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def postmaster_pid(data: str) -> int | None:
    """The pid of the postmaster running on *data*, or ``None`` if none is."""
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            pid = int(f.readline())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    if throwaway.start_time(pid) is None or os.fsencode(data) not in cmdline:
        return None  # gone, or the pid now belongs to another process
    return pid


def _run(args: list[str], run_as: str | None, timeout: float = 120) -> str:
    done = subprocess.run(args, check=True, capture_output=True, user=run_as, timeout=timeout)
    return done.stdout.decode()


TEMPLATE_ENV = "CRONLOCK_PG_TEMPLATE"
"""Where this process's template cluster is (its subprocesses copy it too)."""


class _Template:
    """An ``initdb``'d cluster, never started, that each new cluster is a copy of.

    ``initdb`` takes seconds; ``cp -a`` of its result a fraction of one. One per process
    (made at the first need, under the ``PREFIX`` with an owner file, so a sweep removes
    it should this process die without removing it at exit), or the one of the process
    that started this one (:data:`TEMPLATE_ENV`), while it lasts.
    """

    def __init__(self, root: str, bindir: str, redo_file: str) -> None:
        self.root = root
        self.bindir = bindir
        self.redo_file = redo_file
        """The WAL file of the template's (shutdown) checkpoint: a copy's WAL starts there."""

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    def copy(self, data: str) -> None:
        _run(["cp", "-a", self.data, data], None)

    @classmethod
    def inherited(cls, bindir: str) -> _Template | None:
        root = os.environ.get(TEMPLATE_ENV)
        if not root:
            return None
        try:
            with open(os.path.join(root, "template")) as f:
                made_by, redo_file = f.read().split()
        except (OSError, ValueError):
            return None  # gone with the process that made it, or not for us
        return cls(root, bindir, redo_file) if made_by == bindir else None

    @classmethod
    def make(cls, bindir: str, run_as: str | None) -> _Template:
        root = tempfile.mkdtemp(prefix=PREFIX)
        throwaway.write_owner(root, run_as)
        owner = os.getpid()

        def remove() -> None:
            if os.getpid() == owner:  # not in a forked child
                shutil.rmtree(root, ignore_errors=True)

        atexit.register(remove)
        data = os.path.join(root, "data")
        _run(
            [f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--no-sync"],
            run_as,
        )  # fmt: skip
        control = _run([f"{bindir}/pg_controldata", "-D", data], run_as)
        redo_file = next(
            line.split(":", 1)[1].strip()
            for line in control.splitlines()
            if line.startswith("Latest checkpoint's REDO WAL file:")
        )
        with open(os.path.join(root, "template"), "w") as f:
            f.write(f"{bindir} {redo_file}\n")
        os.environ[TEMPLATE_ENV] = root
        return cls(root, bindir, redo_file)


_template: _Template | None = None
_template_lock = threading.Lock()


def _the_template(bindir: str, run_as: str | None) -> _Template:
    global _template
    with _template_lock:
        if _template is None or not os.path.isdir(_template.data):
            _template = _Template.inherited(bindir) or _Template.make(bindir, run_as)
        return _template


def _dispose(root: str, bindir: str, run_as: str | None, *, grace: float = 1.0) -> None:
    """Stop whatever postmaster runs in *root* (immediately) and remove the directory.

    Keeps looking for *grace* seconds after the postmaster is gone, in case a start was
    still in flight when the owner died.
    """
    data = os.path.join(root, "data")
    quiet_since: float | None = None
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        pid = postmaster_pid(data)
        if pid is None:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= grace:
                break
            time.sleep(0.1)
            continue
        quiet_since = None
        try:
            _run([f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"], run_as, 30)
        except (OSError, subprocess.SubprocessError):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGQUIT)  # what pg_ctl -m immediate sends
            time.sleep(0.2)
    shutil.rmtree(root, ignore_errors=True)


def sweep() -> list[str]:
    """Stop and remove the ``/tmp/cronlock-pg-*`` clusters whose owner is gone; list them."""
    bindir = local_binaries()
    swept: list[str] = []
    for root in throwaway.orphans(PREFIX):
        if bindir is not None:
            _dispose(root, bindir, _run_as(), grace=0)
            swept.append(root)
    return swept


def _run_as() -> str | None:
    return throwaway.run_as_postgres(ClusterUnavailable, "for initdb")


_swept = False


class Cluster:
    """A PostgreSQL cluster of its own on a free port of 127.0.0.1, trust authentication.

    ``start()`` (the first one makes the cluster: a copy of the process's template, which
    the first cluster of a process makes with ``initdb``), ``stop(mode)``,
    ``restart(mode)``, ``destroy()`` (stop and remove everything; also what
    ``with Cluster() as c:`` does on exit), ``crash()`` (``stop("immediate")``). The port,
    hence :attr:`dsn`, stays the same across restarts. Copies of one template share its
    system identifier, as a primary and its standbys do: a locker must not be moved from
    one throwaway cluster to another and expected to see another system.

    ``standby()`` makes a streaming standby of this (running) cluster, a cluster of its own
    (``pg_basebackup -R``: a copy of the data directory that follows this one's WAL), with
    its own directory, port and watchdog, started; ``promote()`` makes a standby the
    primary. A standby is destroyed like any cluster, and by its primary's ``destroy()``.
    """

    def __init__(
        self,
        *,
        watchdog: bool = True,
        max_connections: int = 300,
        options: str = "",
        primary: Cluster | None = None,
    ) -> None:
        bindir = local_binaries()
        if bindir is None:
            raise ClusterUnavailable("no initdb/pg_ctl under /usr/lib/postgresql/*/bin or on PATH")
        self._bindir = bindir
        self._run_as = _run_as()
        self._watch = watchdog
        self.max_connections = max_connections
        self.options = options  # more `-c name=value` for the server, e.g. for a benchmark
        self.port = throwaway.free_port()
        self.root: str | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        self.primary = primary
        """The cluster this one was copied from (a standby), else ``None``."""
        self._standbys: list[Cluster] = []
        self._template: _Template | None = None
        """The template this cluster is a copy of (not a standby's)."""
        self._follows_from: str | None = None
        """A standby copied from the template: the primary's WAL position to catch up to."""

    @property
    def dsn(self) -> str:
        """A DSN of the cluster's ``postgres`` database, as the ``postgres`` superuser."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def data(self) -> str:
        """The data directory."""
        assert self.root is not None, "the cluster was never started"
        return os.path.join(self.root, "data")

    @property
    def postmaster_pid(self) -> int | None:
        """The postmaster's pid while the server runs, else ``None``."""
        return None if self.root is None else postmaster_pid(self.data)

    @property
    def running(self) -> bool:
        """Whether the server runs right now."""
        return self.postmaster_pid is not None

    def start(self) -> None:
        """Start the server (making the cluster first if needed); return once it accepts."""
        if self.root is None:
            self._create()
        if self.running:
            return
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            f"-c max_connections={self.max_connections} {self.options}"
        )
        self._pg_ctl("-o", options, "start")

    def stop(self, mode: Mode = "fast") -> None:
        """Stop the server: ``fast`` (sessions terminated) or ``immediate`` (a crash)."""
        self._pg_ctl("-m", mode, "stop")

    def crash(self) -> None:
        """Stop the server as a crash would (``pg_ctl stop -m immediate``): no checkpoint,
        sessions cut; a start then recovers."""
        self.stop("immediate")

    def standby(self) -> Cluster:
        """A streaming standby of this running cluster, started on a port of its own.

        ``pg_basebackup -R`` (as the ``postgres`` user) copies the data directory and writes
        ``standby.signal`` and ``primary_conninfo``: the copy replays this server's WAL as it
        comes and answers reads, read-only, until :meth:`promote`. It is stopped and removed
        with this cluster (:meth:`destroy`), or on its own. While this cluster's WAL still
        starts at its template's checkpoint (a cluster made a moment ago), a copy of the
        template with the same configuration does as well and is made at once; returns once
        it streams and has replayed what this one had written.
        """
        assert self.running, "a standby copies a running primary"
        standby = Cluster(
            watchdog=self._watch,
            max_connections=self.max_connections,
            options=self.options,
            primary=self,
        )
        self._standbys.append(standby)
        try:
            standby.start()
            standby._caught_up()
        except BaseException:
            standby.destroy()
            raise
        return standby

    def _caught_up(self) -> None:
        """A standby copied from the template: return once it streams from its primary and
        has replayed all the primary had written when it was made (what a base backup
        holds)."""
        lsn, self._follows_from = self._follows_from, None
        if lsn is None:
            return  # pg_basebackup's copy: consistent once started
        # Polled here rather than with tests/eventually.py: this module is also imported as
        # a script's neighbour (the soak, the benchmarks, the watchdog), standard library only.
        deadline = time.monotonic() + 120
        query = (
            "SELECT status = 'streaming' AND pg_last_wal_replay_lsn() >= "
            f"'{lsn}'::pg_lsn FROM pg_stat_wal_receiver"
        )
        while True:
            with contextlib.suppress(subprocess.SubprocessError):
                if self.sql(query) == "t":
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not stream from its primary within 120 s")
            time.sleep(0.05)

    def promote(self) -> None:
        """Make this standby the primary (``pg_ctl promote``); return once it takes writes."""
        assert self.primary is not None, "only a standby can be promoted"
        self._pg_ctl("promote")

    def restart(self, mode: Mode = "fast") -> None:
        """Stop the server in *mode* and start it again, with the same options and port."""
        self._pg_ctl("-m", mode, "restart")  # the options are kept in postmaster.opts

    def destroy(self) -> None:
        """Stop the server at once and remove the cluster (and its standbys); idempotent."""
        standbys, self._standbys = self._standbys, []
        for standby in standbys:
            standby.destroy()
        root, self.root = self.root, None
        if root is not None:
            _dispose(root, self._bindir, self._run_as, grace=0)
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.write(pipe, throwaway.DONE)
            os.close(pipe)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            try:
                watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    # -- internals -------------------------------------------------------------------------

    def _root(self) -> str:
        assert self.root is not None
        return self.root

    def _pg_ctl(self, *args: str) -> None:
        # Always -l: a postmaster that logged to pg_ctl's captured stdout would hold that
        # pipe open, and pg_ctl's caller would wait for it forever.
        log = os.path.join(self._root(), "log")
        _run(
            [f"{self._bindir}/pg_ctl", "-D", self.data, "-l", log, "-w", "-t", "60", *args],
            self._run_as,
        )

    def _create(self) -> None:
        global _swept
        if not _swept:
            _swept = True
            sweep()
        root = tempfile.mkdtemp(prefix=PREFIX)
        self.root = root
        throwaway.write_owner(root, self._run_as)
        if self._watch:
            self._spawn_watchdog(root)
        if self.primary is not None:
            if self._copy_as_standby(self.primary):
                return
            # The primary's configuration comes along (postgresql.conf, pg_hba.conf: trust,
            # replication connections from 127.0.0.1 allowed, as initdb writes it).
            backup = f"{self._bindir}/pg_basebackup"
            _run(
                [backup, "-D", self.data, "-R", "-X", "stream", "-c", "fast", "--no-sync",
                 "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres"],
                self._run_as,
            )  # fmt: skip
            return
        template = _the_template(self._bindir, self._run_as)
        template.copy(self.data)
        self._template = template

    def _copy_as_standby(self, primary: Cluster) -> bool:
        """Make this standby a copy of the template *primary* was copied from, if the
        primary still has every WAL record since (its WAL never left the template's
        checkpoint's file, so no checkpoint can have removed it): the copy then streams
        all of it, and is the standby ``pg_basebackup -R`` would make, in a fraction of
        the time. ``False``: no such luck, make it with ``pg_basebackup``."""
        template = primary._template
        if template is None or not os.path.isdir(template.data):
            return False
        if primary.sql("SELECT pg_walfile_name(pg_current_wal_insert_lsn())") != (
            template.redo_file
        ):
            return False
        template.copy(self.data)
        # What pg_basebackup copies and -R writes: the primary's configuration, and how
        # to follow it.
        for name in ("postgresql.conf", "postgresql.auto.conf", "pg_hba.conf", "pg_ident.conf"):
            shutil.copyfile(os.path.join(primary.data, name), os.path.join(self.data, name))
        with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres'\n")
        signal_file = os.path.join(self.data, "standby.signal")
        open(signal_file, "w").close()
        if self._run_as is not None:
            shutil.chown(signal_file, user=self._run_as)
        self._follows_from = primary.sql("SELECT pg_current_wal_flush_lsn()")
        return True

    def sql(self, query: str) -> str:
        """*query*'s answer (unaligned, tuples only) from the running server, by ``psql``."""
        psql = f"{self._bindir}/psql"
        return _run(
            [psql if os.path.exists(psql) else "psql", "-X", "-A", "-t", "-q", "-h", "127.0.0.1",
             "-p", str(self.port), "-U", "postgres", "-d", "postgres", "-c", query],
            None,
            30,
        ).strip()  # fmt: skip

    def _spawn_watchdog(self, root: str) -> None:
        args = [root, self._bindir] + ([self._run_as] if self._run_as else [])
        self._watchdog, self._pipe = throwaway.spawn_watchdog(__file__, args)


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    _fd, _root_dir, _bindir = int(sys.argv[2]), sys.argv[3], sys.argv[4]
    _run_as_user = sys.argv[5] if len(sys.argv) > 5 else None
    throwaway.watch(_fd, lambda: _dispose(_root_dir, _bindir, _run_as_user))
