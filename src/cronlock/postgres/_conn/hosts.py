"""The hosts of a multi-host DSN, and the order they are tried in.

``postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write`` lists a cluster's
servers; asyncpg tries them in order and takes the first that is usable (with
``read-write``: the primary). But it spends one ``timeout`` across all of them: a host
that drops packets (a crashed primary, a stopped VM) eats the whole of it, and the hosts
after it are never tried, on every attempt. So :class:`ConnectionSource
<.source.ConnectionSource>` tries them one by one, each with a share of the timeout, in
the order :class:`HostOrder` gives: the host that worked last first, hosts that answered
but could not be used (refused, read-only) after the others, and hosts that stayed silent
last, with no more than their even share of the timeout.

The hosts are asyncpg's own reading of the DSN and the connect arguments (its private
``_parse_connect_arguments``, which every ``asyncpg.connect`` goes through: hosts and
ports, ``?host=``, ``PGHOST``, Unix sockets), so cronlock never reads a DSN differently
from the driver. Should asyncpg change it, :func:`addresses` finds no list and the DSN is
handed to ``asyncpg.connect`` whole, as before.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ("Address", "HostOrder", "addresses", "shown", "warm_up")

Address = tuple[str, int] | str
"""What asyncpg connects to: ``(host, port)``, or a Unix socket's path."""

_WORKED, _UNKNOWN, _ANSWERED, _SILENT, _NOT_PRIMARY = range(5)


@functools.cache
def _parser() -> tuple[Any, frozenset[str], dict[str, Any]]:
    """asyncpg's parser of connect arguments, the names it takes, and ``connect``'s
    defaults for them (what a plain ``asyncpg.connect(dsn)`` passes it)."""
    import asyncpg
    from asyncpg import connect_utils

    parse = connect_utils._parse_connect_arguments
    names = frozenset(inspect.signature(parse).parameters)
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(asyncpg.connect).parameters.items()
        if name in names and parameter.default is not inspect.Parameter.empty
    }
    return parse, names, defaults


async def warm_up() -> None:
    """Import asyncpg and read its connect parser ahead of the first connect (15-20 ms of
    imports), in a worker thread, so that the event loop goes on meanwhile (a service's
    other tasks, a scheduler started late); at once once done (a readiness probe's checks)."""
    if not _parser.cache_info().currsize:
        await asyncio.to_thread(_parser)


def addresses(dsn: str, connect_kwargs: Mapping[str, Any]) -> list[Address]:
    """The addresses ``asyncpg.connect(dsn, **connect_kwargs)`` would try, in order; empty
    when asyncpg cannot say (the DSN is invalid: connecting says why)."""
    try:
        parse, names, defaults = _parser()
        given = {name: value for name, value in connect_kwargs.items() if name in names}
        found, _params, _config = parse(**{**defaults, **given, "dsn": dsn})
    except Exception:  # an invalid DSN or option, or an asyncpg that parses differently
        return []
    result: list[Address] = []
    for address in found:
        if isinstance(address, str):
            result.append(address)  # a Unix socket
        else:
            host, port = address
            result.append((str(host), int(port)))
    return result


def shown(address: Address) -> str:
    """``host:port`` (``[v6]:port``), or a socket's path: never a secret."""
    if isinstance(address, str):
        return address
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HostOrder:
    """Which host of a DSN to try first, from what each did the last time.

    The host a connection last worked on goes first; a host with no news next (in the
    DSN's order); a host that answered but could not be used (refused the connection, or
    asyncpg found it read-only for ``target_session_attrs``) after those; then a host that
    did not answer in its time; and last a host whose connection a set-up refused as not
    the primary. That one was a connection as far as the host-by-host loop could tell, so
    the loop stopped there: put anywhere before a silent host, it would be tried first,
    and refused, every time, while the primary behind it is never reached.
    """

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: dict[Address, int] = {}

    def order(self, found: Sequence[Address]) -> list[Address]:
        """*found* in the order to try them (stable: the DSN's order within a rank)."""
        return sorted(found, key=lambda address: self._marks.get(address, _UNKNOWN))

    def budget(self, address: Address, fair: float, share: float) -> float:
        """Seconds to give *address*: *fair* (what is left, split among the hosts left),
        but no more than its even *share* of the timeout for a host that stayed silent
        last time, so that it cannot eat the time of the hosts after it."""
        return min(fair, share) if self._marks.get(address) == _SILENT else fair

    def worked(self, address: Address) -> None:
        """A usable connection was had from *address*: it goes first from now on."""
        for other, mark in tuple(self._marks.items()):
            if mark == _WORKED:
                del self._marks[other]
        self._marks[address] = _WORKED

    def failed(self, address: Address, *, silent: bool) -> None:
        """*address* could not be used: it did not answer in time (*silent*), or answered
        no (refused, authentication, read-only for ``target_session_attrs``)."""
        self._marks[address] = _SILENT if silent else _ANSWERED

    def not_primary(self, address: Address) -> None:
        """A connection *address* gave turned out not to be on the primary (its set-up or
        a statement said so): it goes last."""
        self._marks[address] = _NOT_PRIMARY
