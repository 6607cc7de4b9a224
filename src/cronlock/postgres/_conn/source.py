"""Where the backend's connections come from, how each session is set up, how it is dropped.

Only the :mod:`cronlock.postgres` subpackage may import asyncpg, so that it stays an
optional extra; it is imported at the first connect, not when this module is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..._cancel import finish_uncancellably, task_name
from ..._dsn import connect_failure, target_of
from ..._errors import LockError
from ..._logs import get_logger
from .._sql.sessions import set_config_sql
from .errors import backend_error_types, backend_errors, cut_off, kind_of, server_answered
from .hosts import Address, HostOrder, addresses, shown
from .primary import FIX, NotPrimary

_logger = get_logger("cronlock.postgres")

__all__ = (
    "POOL_WATCH_INTERVAL",
    "ConnectionSource",
    "Connector",
    "Keepalives",
    "configure_session",
    "default_application_name",
    "is_closed",
    "terminate",
    "watch_pool",
)

# PostgreSQL truncates application_name to NAMEDATALEN - 1 bytes.
_MAX_APPLICATION_NAME = 63


def default_application_name() -> str:
    """``cronlock:<hostname>:<pid>``, so pg_stat_activity and pg_locks show who holds what."""
    name = f"cronlock:{socket.gethostname()}:{os.getpid()}"
    if len(name.encode()) <= _MAX_APPLICATION_NAME:
        return name
    # Keep the pid, which tells processes on one host apart; shorten the host name.
    suffix = f":{os.getpid()}"
    head = name[: _MAX_APPLICATION_NAME - len(suffix)]
    return head.encode()[: _MAX_APPLICATION_NAME - len(suffix)].decode(errors="ignore") + suffix


@dataclass(frozen=True, slots=True)
class Keepalives:
    """TCP settings applied server-side to a lock session, so a dead client is noticed.

    After a network cut, the server keeps the session, and with it every advisory lock it
    holds, until it notices the peer is gone: hours with operating-system defaults. With the
    defaults here it probes after *idle* seconds of silence, every *interval* seconds, and
    drops the session after *count* unanswered probes (about a minute), or when data it sent
    stays unacknowledged for *user_timeout* seconds. They set the server's
    ``tcp_keepalives_idle``, ``tcp_keepalives_interval``, ``tcp_keepalives_count`` and
    ``tcp_user_timeout`` for that session only; over a Unix-domain socket they do nothing.
    A frozen (not dead) client process still answers probes: no keepalive detects that.
    """

    idle: int = 30
    interval: int = 10
    count: int = 3
    user_timeout: float | None = 60.0


async def configure_session(
    conn: Any, *, application_name: str | None, keepalives: Keepalives | None
) -> None:
    """Label the session and set its keepalives, in one round trip."""
    settings: list[tuple[str, str]] = []
    if application_name is not None:
        settings.append(("application_name", application_name))
    if keepalives is not None:
        settings += [
            ("tcp_keepalives_idle", str(int(keepalives.idle))),
            ("tcp_keepalives_interval", str(int(keepalives.interval))),
            ("tcp_keepalives_count", str(int(keepalives.count))),
        ]
        # tcp_user_timeout exists since PostgreSQL 12.
        if keepalives.user_timeout is not None and conn.get_server_version().major >= 12:
            settings.append(("tcp_user_timeout", str(int(keepalives.user_timeout * 1000))))
    if not settings:
        return
    await conn.execute(set_config_sql(len(settings)), *[v for pair in settings for v in pair])


def _interface_error() -> type[Exception]:
    """asyncpg's InterfaceError; asyncpg is loaded already, since *conn* came from it."""
    import asyncpg

    error: type[Exception] = asyncpg.InterfaceError
    return error


def is_closed(conn: Any) -> bool:
    """Whether *conn* (a connection or a pool proxy) can no longer run statements."""
    try:
        return bool(conn.is_closed())
    except _interface_error():  # a pool proxy that was already handed back
        return True


def terminate(conn: Any) -> None:
    """Drop *conn* without a goodbye; the server then releases every lock of that session.

    Synchronous, so it cannot be interrupted by a cancellation half way.
    """
    with contextlib.suppress(_interface_error()):  # a proxy already handed back
        conn.terminate()


@runtime_checkable
class Connector(Protocol):
    """Something else to connect to: the simulated server of ``cronlock._sim`` (its
    connections answer what the backend asks of asyncpg's, and raise asyncpg's errors)."""

    def describe(self) -> str:
        """What it is, for error messages (never a password)."""
        ...

    async def connect(self, timeout: float, **kwargs: Any) -> Any:
        """A new connection within *timeout* seconds (*kwargs*: what ``asyncpg.connect``
        would be given, as ``statement_cache_size``)."""
        ...


class ConnectionSource:
    """Where dedicated connections come from: an asyncpg pool, a DSN to connect to, or a
    :class:`Connector`.

    A DSN that lists several hosts is tried host by host (:mod:`.hosts`), each with a share
    of the connect timeout, the host that worked last first.
    """

    __slots__ = (
        "_address_of",
        "_connect_kwargs",
        "_connector",
        "_dsn",
        "_hosts",
        "_pool",
        "_told",
    )

    def __init__(self, pool_or_dsn: Any, connect_kwargs: Mapping[str, Any] | None = None) -> None:
        # Whoever made a pool imported asyncpg: no need to import it to recognise one.
        asyncpg = sys.modules.get("asyncpg")
        self._connector: Connector | None = None
        if isinstance(pool_or_dsn, str):
            self._dsn: str | None = pool_or_dsn
            self._pool: Any = None
        elif asyncpg is not None and isinstance(pool_or_dsn, asyncpg.Pool):
            if connect_kwargs:
                raise TypeError("connect_kwargs only apply when a DSN is given, not a pool")
            self._dsn = None
            self._pool = pool_or_dsn
        elif isinstance(pool_or_dsn, Connector):
            self._dsn, self._pool, self._connector = None, None, pool_or_dsn
        else:
            raise TypeError(
                f"expected an asyncpg.Pool or a DSN string, got {type(pool_or_dsn).__name__}"
            )
        self._connect_kwargs = dict(connect_kwargs or {})
        self._hosts = HostOrder()
        # Which host each connection of a multi-host DSN came from, for as long as it lives.
        self._address_of: weakref.WeakKeyDictionary[Any, Address] = weakref.WeakKeyDictionary()
        self._told = False  # a session of ours could not connect, and it was said

    def told(self, exc: BaseException) -> bool:
        """Whether an outage of one of our sessions (*exc*, its first failed connect) was
        said already by another: an outage, or a server that is not the primary, is said
        once per source (one ERROR per locker, not one per lock session), until a session
        is set up again (then the next one is news)."""
        told, self._told = self._told, True
        return told

    @property
    def pooled(self) -> bool:
        """True when connections are borrowed from a pool rather than opened directly."""
        return self._pool is not None

    async def wait_pool_closing(self, interval: float) -> None:
        """Return once the pool we borrow from starts closing (looked at every *interval*).

        Never returns for a DSN. asyncpg has no hook for it, hence the (cheap) polling.
        """
        while self._pool is None or not self._pool.is_closing():  # noqa: ASYNC110 - no event
            await asyncio.sleep(interval)

    def describe(self) -> str:
        """A short description for error messages; never includes a password."""
        if self._pool is not None:
            return f"asyncpg pool (max_size={self._pool.get_max_size()})"
        if self._connector is not None:
            return self._connector.describe()
        return "PostgreSQL server"

    async def checkout(self, *, timeout: float) -> Any:
        """Return a connection for this caller alone, within *timeout* seconds.

        Raises :class:`LockError` when none can be had: pool exhausted, server unreachable.
        """
        with backend_errors(f"could not get a connection from the {self.describe()}"):
            try:
                if self._pool is not None:
                    return await self._pool.acquire(timeout=timeout)
                return await self._connect(timeout)
            except TimeoutError as exc:  # an OSError too, but worth its own message
                if self._pool is not None:
                    raise LockError(
                        f"no connection free in the {self.describe()} after {timeout:g}s "
                        f"({self._pool.get_size() - self._pool.get_idle_size()} in use): the "
                        "pool is exhausted; raise max_size or acquire_timeout"
                    ) from exc
                raise LockError(
                    f"could not connect to the PostgreSQL server in {timeout:g}s"
                ) from exc

    def where(self, conn: Any) -> str:
        """Which server *conn* is on, as far as this source knows; never a password."""
        address = self._address_of.get(conn)
        if address is not None:
            return f"the server at {shown(address)}"
        if self._dsn is not None and (target := target_of(self._dsn)).clean:
            return target.where
        return self.describe()

    def went_silent(self, conn: Any) -> None:
        """*conn*'s server stopped answering (a statement timed out): its host goes after
        the others at the next connect, as one that stayed silent does (a primary gone
        off the network would eat each reconnect's share of the timeout first)."""
        address = self._address_of.get(conn)
        if address is not None:
            self._hosts.failed(address, silent=True)

    def not_primary(self, conn: Any, exc: BaseException) -> NotPrimary:
        """*conn*'s server turned out not to be the primary: its set-up said so (*exc*, a
        :class:`.primary.NotPrimary`), or it refused a write (*exc*, SQLSTATE 25006). Its
        host goes last from now on; the error to raise, naming it."""
        address = self._address_of.get(conn)
        if address is not None:
            self._hosts.not_primary(address)
        if isinstance(exc, NotPrimary):
            error = NotPrimary(f"{self.where(conn)}: {exc}")
            error.__cause__ = exc.__cause__
        else:
            error = NotPrimary(
                f"{self.where(conn)} refused a write ({type(exc).__name__}: {exc}): it is "
                f"read-only, not the primary; {FIX}"
            )
            error.__cause__ = exc
        return error

    async def _connect(self, timeout: float) -> Any:
        """A new connection of the DSN; a failure is said without the password (:mod:`._dsn`)."""
        if self._connector is not None:
            return await self._connector.connect(timeout, **self._connect_kwargs)
        assert self._dsn is not None
        found = addresses(self._dsn, self._connect_kwargs) if target_of(self._dsn).clean else []
        if len(found) > 1:
            return await self._connect_each(found, timeout)
        return await self._connect_to(timeout)

    async def _connect_each(self, found: list[Address], timeout: float) -> Any:
        """A connection to the first host of *found* (in :class:`.hosts.HostOrder`) that
        gives one, each host within its share of *timeout*: asyncpg would spend the whole
        of it on the first host that does not answer."""
        import asyncpg

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        order = self._hosts.order(found)
        failures: list[tuple[Address, Exception]] = []
        for tried, address in enumerate(order):
            left = deadline - loop.time()
            if left <= 0:
                break
            budget = self._hosts.budget(address, left / (len(order) - tried), timeout / len(order))
            host, port = (address, None) if isinstance(address, str) else address
            kwargs = {**self._connect_kwargs, "host": host, "port": port}
            try:
                conn = await asyncpg.connect(self._dsn, timeout=budget, **kwargs)
            except Exception as exc:  # this host is no good now: on to the next
                self._hosts.failed(address, silent=isinstance(exc, TimeoutError))
                failures.append((address, exc))
                continue
            self._hosts.worked(address)
            self._address_of[conn] = address
            return conn
        raise self._none_of(order, failures, timeout)

    def _none_of(
        self, order: list[Address], failures: list[tuple[Address, Exception]], timeout: float
    ) -> LockError:
        """The error of a multi-host connect that found no host: what each one said."""
        secrets = target_of(self._dsn).secrets
        said = []
        for address, exc in failures:
            if isinstance(exc, TimeoutError):
                said.append(f"{shown(address)}: no answer in time")
                continue
            text = (str(exc).strip().splitlines() or [""])[0]
            for secret in secrets:
                text = text.replace(secret, "***")
            said.append(f"{shown(address)}: {type(exc).__name__}{': ' if text else ''}{text}")
        if len(failures) < len(order):
            said.append(f"{len(order) - len(failures)} not tried in time")
        message = (
            f"cannot connect to any of the {len(order)} hosts of the DSN in {timeout:g}s "
            f"({'; '.join(said)})"
        )
        answers = [exc for _, exc in failures if not isinstance(exc, TimeoutError)]
        if not answers:
            return LockError(message)
        last = answers[-1]
        error = kind_of(last)(message) if isinstance(last, backend_error_types()) else None
        error = error or LockError(message)
        error.__cause__ = last
        return error

    async def _connect_to(self, timeout: float) -> Any:
        """A connection to wherever the DSN says."""
        import asyncpg  # the first connect of a DSN loads it

        try:
            return await asyncpg.connect(self._dsn, timeout=timeout, **self._connect_kwargs)
        except TimeoutError:
            raise  # said by checkout(), without the error's text
        except Exception as exc:
            reason = connect_failure(self._dsn, exc)
            # The cause is kept only for a DSN that parses cleanly: for one that does not,
            # its message may quote the password (so would its traceback).
            cause = exc if target_of(self._dsn).clean else None
            if not isinstance(exc, backend_error_types()):
                # A LockError like any failed connect, so a scheduler reports LockFailed
                # for it and retries (the DSN may be fixed in place: a secret mounted late).
                raise LockError(f"cannot connect to PostgreSQL: {reason}") from cause
            message = f"could not get a connection from the {self.describe()}: {reason}"
            raise kind_of(exc)(message) from cause

    async def checkin(self, conn: Any, *, timeout: float) -> None:
        """Give *conn* back (pool) or close it (DSN); terminate it if that fails or times out.

        Never raises a backend error: the connection is gone from our hands either way.
        """
        if is_closed(conn):
            terminate(conn)  # lets a pool reclaim the holder of a connection that died
            return
        try:
            if self._pool is not None:
                # The pool's reset also runs pg_advisory_unlock_all(): a backstop only. The
                # release is bounded by its own timeout, not by ours around it: asyncpg
                # shields it, so a deadline of ours at the same instant would cancel only
                # the wait, and the release's own TimeoutError would go unretrieved
                # ("Task exception was never retrieved", found by the fleet simulation on a
                # stalled server, lease mode on a pool).
                await self._pool.release(conn, timeout=timeout)
            else:
                async with asyncio.timeout(timeout):
                    await conn.close()
        except backend_error_types():
            terminate(conn)

    @contextlib.asynccontextmanager
    async def lend(
        self,
        *,
        timeout: float,
        checkin_timeout: float | None = None,
        keep_on_server_error: bool = False,
    ) -> AsyncIterator[Any]:
        """A connection for the block alone, within *timeout*; given back after it.

        A block that failed on the connection (cut off mid-statement by a cancellation or a
        timeout, a backend error) terminates it first: its state is unknown, and only this
        connection is lost by ending it; any other exception leaves it as it was.
        *keep_on_server_error*: an error answer of the server leaves the connection sound.
        The one way a connection is borrowed and handed back.
        """
        conn = await self.checkout(timeout=timeout)
        try:
            yield conn
        except BaseException as exc:
            if cut_off(exc) and not (keep_on_server_error and server_answered(exc)):
                terminate(conn)
            raise
        finally:
            await self.checkin(
                conn, timeout=timeout if checkin_timeout is None else checkin_timeout
            )

    async def open(
        self, set_up: Callable[[Any], Awaitable[None]], *, timeout: float
    ) -> tuple[Any, BaseException | None]:
        """A connection of our own, *set_up*, and the cancellation that came meanwhile.

        The set-up runs to its end even if the caller is cancelled meanwhile (bounded by
        *timeout*): cut off mid-statement, the connection would have to be terminated,
        costing a pool its connection. A connection set up is returned with the
        cancellation, for the caller to keep or drop before delivering it; one whose set-up
        failed is terminated (synchronously: a second cancel cannot skip it). The one way a
        session of our own is opened.
        """
        conn = await self.checkout(timeout=timeout)

        async def setting_up() -> None:
            with backend_errors("could not set up the session"):
                async with asyncio.timeout(timeout):
                    await set_up(conn)

        task = asyncio.create_task(setting_up(), name=task_name("pg-setup"))
        try:
            await finish_uncancellably(task)
        except BaseException as exc:
            if not task.done() or task.cancelled() or task.exception() is not None:
                terminate(conn)
                if isinstance(exc, NotPrimary):
                    raise self.not_primary(conn, exc) from exc.__cause__
                raise
            self._told = False
            return conn, exc
        self._told = False
        return conn, None


POOL_WATCH_INTERVAL = 0.5
"""Seconds between two looks at whether a borrowed-from pool is closing."""


def watch_pool(
    source: ConnectionSource, close: Callable[[], Awaitable[None]]
) -> asyncio.Task[None] | None:
    """A task that calls *close* once the pool *source* borrows from starts closing.

    ``Pool.close()`` waits for every borrowed connection: closing the pool while a locker
    holds some would hang. The watch hands them back (and says what to fix). ``None`` for
    a DSN."""
    if not source.pooled:
        return None

    async def on_closing() -> None:
        await source.wait_pool_closing(POOL_WATCH_INTERVAL)
        _logger.warning(
            "the asyncpg pool is closing while a PostgresLocker still borrows its "
            "connections; handing them back now (their locks are lost). Shut the "
            "Scheduler down (or close the locker) before closing the pool."
        )
        await close()

    return asyncio.create_task(on_closing(), name=task_name("pool-watch"))
