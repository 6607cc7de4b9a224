"""A PgBouncer of its own in front of a PostgreSQL server, to test what holds behind a pooler.

The documentation tells users that session advisory locks break behind PgBouncer in
transaction mode; the tests that back such claims need a real pooler, not an assumption.
:class:`PgBouncer` runs the local ``pgbouncer`` binary (Debian's package) with a config of
its own in ``/tmp/cronlock-pgbouncer-*``, on a free port of 127.0.0.1, trust
authentication, never touching the machine's server beyond opening connections to it.
PgBouncer refuses to run as root, so under root it runs as the ``postgres`` user.

It must not outlive the test run, even when pytest is killed without running finalizers,
the same way as cluster.py's throwaway clusters:

- a **watchdog** process (this file, run as a script) holds the read end of a pipe whose
  write end only the owner holds; at end-of-file (the owner exited or was SIGKILLed) it
  stops every pgbouncer started with this directory's config and removes the directory.
- the first start in a process **sweeps** ``/tmp/cronlock-pgbouncer-*`` directories whose
  owner (pid and start time, against pid reuse) is gone, in case a watchdog died too.

The pgbouncer process is found by its command line (the config's path, unique to the
directory), not by its pid file: that is right even before the pid file is written, and
a reused pid cannot match.

Only the standard library is imported here, so the watchdog starts quickly.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

try:
    from . import throwaway
except ImportError:  # run as a script (the watchdog): its folder is on sys.path
    import throwaway  # type: ignore[no-redef,import-not-found]

__all__ = (
    "PREFIX",
    "PgBouncer",
    "PgBouncerUnavailable",
    "pgbouncer_binary",
    "psql_binary",
    "sweep",
)

PREFIX = "cronlock-pgbouncer-"
CONFIG_FILE = "pgbouncer.ini"
LOG_FILE = "pgbouncer.log"
_STARTUP_SECONDS = 30.0


class PgBouncerUnavailable(RuntimeError):
    """No ``pgbouncer`` binary (or no user to run it as, or it would not start)."""


def pgbouncer_binary() -> str | None:
    """The path of the local ``pgbouncer``, or ``None``.

    Debian installs it in ``/usr/sbin``, which is not on a non-root user's ``PATH``.
    """
    found = shutil.which("pgbouncer")
    if found:
        return found
    for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"):
        if os.access(path, os.X_OK):
            return path
    return None


def psql_binary() -> str | None:
    """The path of a local ``psql``, or ``None``.

    The admin console speaks only the simple query protocol, and asyncpg's ``fetch`` always
    uses the extended one ("extended query protocol not supported by admin console"), so
    :meth:`PgBouncer.show` reads it with ``psql`` instead.
    """
    found = shutil.which("psql")
    if found:
        return found
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))
    return versions[-1] if versions else None


def _pids_using(config: str) -> list[int]:
    """The live processes whose command line has *config* as an argument."""
    wanted = os.fsencode(config)
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if wanted in args and throwaway.start_time(int(entry)) is not None:
            pids.append(int(entry))
    return pids


def _dispose(root: str, *, grace: float = 1.0) -> None:
    """Stop every pgbouncer running on *root*'s config and remove the directory.

    SIGTERM is PgBouncer's immediate shutdown (SIGINT would wait for clients to leave);
    SIGKILL follows if it lingers. Keeps looking for *grace* seconds after none is left,
    in case a start was still in flight when the owner died.
    """
    config = os.path.join(root, CONFIG_FILE)
    quiet_since: float | None = None
    terminated_at: float | None = None
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        pids = _pids_using(config)
        if not pids:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= grace:
                break
            time.sleep(0.1)
            continue
        quiet_since = None
        hard = terminated_at is not None and time.monotonic() - terminated_at > 5
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
        terminated_at = terminated_at or time.monotonic()
        time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)


def sweep() -> list[str]:
    """Stop and remove the ``/tmp/cronlock-pgbouncer-*`` poolers whose owner is gone."""
    swept: list[str] = []
    for root in throwaway.orphans(PREFIX):
        _dispose(root, grace=0)
        swept.append(root)
    return swept


def _run_as() -> str | None:
    return throwaway.run_as_postgres(PgBouncerUnavailable, "to run pgbouncer as")


def _connstr_value(value: str) -> str:
    """*value* as PgBouncer's ``[databases]`` connect string reads it."""
    if "'" in value or "\\" in value:
        raise ValueError(f"cannot put {value!r} in a PgBouncer connect string")
    return f"'{value}'" if not value or any(c.isspace() or c in "=;" for c in value) else value


def _parse_dsn(dsn: str) -> dict[str, str]:
    """host, port, dbname, user (and password, if any) of a ``postgresql://`` DSN.

    Query parameters the pooler would have to pass on as server settings (``search_path``
    in the suite's ``pg_dsn``) are dropped: PgBouncer refuses unknown startup parameters.
    """
    parts = urlsplit(dsn)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    found = {
        "host": query.get("host") or unquote(parts.hostname or "") or "127.0.0.1",
        "port": query.get("port") or str(parts.port or 5432),
        "dbname": query.get("dbname") or unquote(parts.path.lstrip("/")) or "postgres",
        "user": query.get("user") or unquote(parts.username or "") or "postgres",
    }
    password = query.get("password") or (unquote(parts.password) if parts.password else "")
    if password:
        found["password"] = password
    return found


class PgBouncer:
    """PgBouncer on a free port of 127.0.0.1, pooling one database of one server.

    Clients connect as ``postgres`` without a password (trust; the pooler logs in to the
    server with the target's user and password). ``with PgBouncer(...) as bouncer:``
    starts it and stops it (removing its directory) on exit; :meth:`start` and
    :meth:`stop` do the same by hand. ``postgres`` is also the admin console's user, so
    :meth:`show` (``SHOW POOLS`` and such) and :meth:`server_connections` work.

    *pool_mode* is ``transaction`` unless told; *settings* adds or overrides lines of the
    ``[pgbouncer]`` section (say ``{"ignore_startup_parameters": "..."}``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5432,
        dbname: str = "postgres",
        user: str = "postgres",
        *,
        password: str | None = None,
        pool_mode: str = "transaction",
        default_pool_size: int = 10,
        max_client_conn: int = 1000,
        settings: Mapping[str, str] | None = None,
        watchdog: bool = True,
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise PgBouncerUnavailable(
                "no pgbouncer binary on PATH or in /usr/sbin (apt-get install pgbouncer)"
            )
        self._binary = binary
        self._run_as = _run_as()
        self._watch = watchdog
        self.target_host = host
        self.target_port = port
        self.dbname = dbname
        self._target_user = user
        self._target_password = password
        self.pool_mode = pool_mode
        self.default_pool_size = default_pool_size
        self.max_client_conn = max_client_conn
        self._settings = dict(settings or {})
        self.port = throwaway.free_port()
        self.root: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None

    @classmethod
    def for_dsn(
        cls,
        dsn: str,
        *,
        pool_mode: str = "transaction",
        default_pool_size: int = 10,
        max_client_conn: int = 1000,
        settings: Mapping[str, str] | None = None,
        watchdog: bool = True,
    ) -> PgBouncer:
        """A PgBouncer in front of the server and database of *dsn* (see :func:`_parse_dsn`)."""
        target = _parse_dsn(dsn)
        return cls(
            target["host"],
            int(target["port"]),
            target["dbname"],
            target["user"],
            password=target.get("password"),
            pool_mode=pool_mode,
            default_pool_size=default_pool_size,
            max_client_conn=max_client_conn,
            settings=settings,
            watchdog=watchdog,
        )

    @property
    def dsn(self) -> str:
        """The DSN clients use: the pooled database, as ``postgres``, through the pooler."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def admin_dsn(self) -> str:
        """The admin console's DSN (simple query protocol only: not for asyncpg's fetch)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/pgbouncer"

    @property
    def pid(self) -> int | None:
        """The pgbouncer process's pid while it runs, else ``None``."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the pooler runs right now."""
        return self.pid is not None

    @property
    def log(self) -> str:
        """PgBouncer's log so far (empty before the first start)."""
        if self.root is None:
            return ""
        try:
            with open(os.path.join(self.root, LOG_FILE), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def start(self) -> None:
        """Start the pooler; return once it listens. Raises PgBouncerUnavailable if not."""
        if self.running:
            return
        if self.root is None:
            self._create()
        for attempt in range(5):
            if attempt:  # the port was taken between choosing and binding it: another one
                self.port = throwaway.free_port()
            self._write_config()
            try:
                if self._launch():
                    return
            except BaseException:
                self._kill()
                raise
        raise PgBouncerUnavailable(f"pgbouncer found no free port:\n{self._log_tail()}")

    def stop(self) -> None:
        """Stop the pooler at once (clients are cut off) and remove its directory; idempotent."""
        self._kill()
        root, self.root = self.root, None
        if root is not None:
            _dispose(root, grace=0)
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

    def show(self, what: str = "POOLS") -> list[dict[str, str]]:
        """The rows of the admin console's ``SHOW <what>`` (``POOLS``, ``SERVERS``, ...)."""
        psql = psql_binary()
        if psql is None:
            raise PgBouncerUnavailable("no psql to read PgBouncer's admin console with")
        # No PG* variables from the environment: they could point psql somewhere else.
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env["PGCONNECT_TIMEOUT"] = "10"
        command = [psql, "-X", "--csv", "-v", "ON_ERROR_STOP=1", "-d", self.admin_dsn]
        result = subprocess.run(
            [*command, "-c", f"SHOW {what}"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        return list(csv.DictReader(io.StringIO(result.stdout)))

    def server_connections(self) -> int:
        """Server connections the pooler holds to the pooled database, busy or idle."""
        return sum(
            int(value)
            for row in self.show("POOLS")
            if row["database"] == self.dbname
            for column, value in row.items()
            if column.startswith("sv_")
        )

    def __enter__(self) -> PgBouncer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _create(self) -> None:
        global _swept
        if not _swept:
            _swept = True
            sweep()
        root = tempfile.mkdtemp(prefix=PREFIX)
        self.root = root
        throwaway.write_owner(root, None)
        # The watchdog first: a start that is under way when the owner dies is caught too.
        if self._watch:
            self._spawn_watchdog(root)
        # PgBouncer (as postgres) writes its log and pid file here, and reads the config.
        if self._run_as is not None:
            shutil.chown(root, user=self._run_as)

    def _write_config(self) -> None:
        root = self.root
        assert root is not None
        target = {
            "host": self.target_host,
            "port": str(self.target_port),
            "dbname": self.dbname,
            "user": self._target_user,
        }
        if self._target_password:
            target["password"] = self._target_password
        connstr = " ".join(f"{key}={_connstr_value(value)}" for key, value in target.items())
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",  # TCP only: nothing outside this directory
            "auth_type": "trust",
            "auth_file": os.path.join(root, "userlist.txt"),  # trust still wants the user
            "admin_users": "postgres",
            "stats_users": "postgres",
            "pool_mode": self.pool_mode,
            "default_pool_size": str(self.default_pool_size),
            "max_client_conn": str(self.max_client_conn),
            "ignore_startup_parameters": "extra_float_digits",  # as in the stock config
            "logfile": os.path.join(root, LOG_FILE),
            "pidfile": os.path.join(root, "pgbouncer.pid"),
        } | self._settings
        lines = ["[databases]", f"{self.dbname} = {connstr}", "", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in settings.items()]
        with open(os.path.join(root, CONFIG_FILE), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(root, "userlist.txt"), "w") as f:
            f.write('"postgres" ""\n')

    def _launch(self) -> bool:
        """Run pgbouncer in the foreground; True once it listens, False if the port was taken."""
        root = self.root
        assert root is not None
        log = os.path.join(root, LOG_FILE)
        with contextlib.suppress(FileNotFoundError):
            os.truncate(log, 0)  # the log of an attempt on a taken port says nothing now
        self._process = subprocess.Popen(
            [self._binary, os.path.join(root, CONFIG_FILE)],
            cwd=root,
            user=self._run_as,
            group=self._run_as,
            extra_groups=[] if self._run_as else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # it logs to its logfile as well
            start_new_session=True,  # out of reach of the terminal's Ctrl-C
        )
        listening = f"listening on 127.0.0.1:{self.port}"
        deadline = time.monotonic() + _STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                if "Address already in use" in self.log:
                    return False
                raise PgBouncerUnavailable(f"pgbouncer exited at start:\n{self._log_tail()}")
            if listening in self.log and self._accepts():
                return True
            time.sleep(0.05)
        raise PgBouncerUnavailable(f"pgbouncer did not listen within 30 s:\n{self._log_tail()}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()  # SIGTERM: PgBouncer's immediate shutdown
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.splitlines()[-lines:])

    def _spawn_watchdog(self, root: str) -> None:
        self._watchdog, self._pipe = throwaway.spawn_watchdog(__file__, [root])


_swept = False


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    _root = sys.argv[3]
    throwaway.watch(int(sys.argv[2]), lambda: _dispose(_root))
