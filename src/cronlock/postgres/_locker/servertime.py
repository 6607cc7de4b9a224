"""The server's clock, read over a lock session (for fleet time), and the fair race.

**Reading the clock.** :func:`read_server_clock` sends ``SELECT clock_timestamp()`` on an
open lock session (or opens the first shard's), reading the caller's clock right before and
right after, inside the session's statement lock: time spent waiting behind another
statement is not counted in the round trip. The maths is :mod:`cronlock._core.fleetclock`'s.

**The fair race.** Once the replicas fire by one fleet clock, they reach the server for
the same slot within a fraction of a millisecond of each other, and what decides who wins
is whatever small bias one of them has (a slightly smaller offset error, a process woken
first): the same replica wins nearly every slot. So before a claim each locker waits a
pseudo-random few milliseconds drawn for (this locker, slot, lane): the draws, not the
bias, decide, and each replica wins its share of slots. A *lane* is one of :data:`LANES`
groups of a locker's jobs (by lock key, ``key % LANES``): the draw is the same for every
job of one lane due at one instant, so those still go to the server together, while a
burst of many jobs at one instant is won lane by lane, spread over the replicas, rather
than all by whichever replica drew the shortest wait. The lanes are the locker's, not each
shard's: with the default four sessions a lane lies in one shard and a shard has two, so a
replica sends at most eight claim statements per instant in all, however its jobs fall.
Every statement costs the server a fixed share of its time (more than a few more rows do),
and at an instant when every replica claims at once that share is what the claims wait
for.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ..._cancel import task_name, uncancellable
from .._conn import Channel
from .._sql.fleet import SERVER_CLOCK_SQL

__all__ = ("DEFAULT_AHEAD", "DEFAULT_SPREAD", "LANES", "FairRace", "read_server_clock")

LANES = 8
"""Groups of a locker's jobs that race on their own draw (see the module's docstring)."""

DEFAULT_SPREAD = 0.010
"""Seconds: the longest wait before a claim (``PostgresLocker(spread=...)``)."""

DEFAULT_AHEAD = 0.100
"""Seconds: how long before its slot a claim may go out (``PostgresLocker(claim_ahead=...)``)."""


async def read_server_clock(
    sessions: Sequence[Channel], read: Callable[[], datetime]
) -> tuple[datetime, datetime, datetime]:
    """``(read(), the server's clock, read())`` over the first open session of *sessions*,
    else one being opened, else the first (opened for it)."""
    session = next((s for s in sessions if s.is_open), None) or next(
        (s for s in sessions if s.connect_lock.locked()), sessions[0]
    )
    conn, generation = await session.ensure()

    async def sample(c: Any) -> tuple[datetime, datetime, datetime]:
        sent = read()
        server: datetime = await c.fetchval(SERVER_CLOCK_SQL)
        return sent, server, read()

    return await uncancellable(
        session.run(
            conn, generation, sample, what="reading the server's clock", keep_on_server_error=True
        ),
        name=task_name("pg-clock"),
    )


class FairRace:
    """The wait before each claim: pseudo-random in ``[0, spread)`` per (slot, lane)."""

    __slots__ = ("_gates", "_seed", "_spread")

    def __init__(self, spread: float) -> None:
        self._spread = spread
        self._seed = secrets.token_bytes(8)  # this locker's own draws
        self._gates: dict[tuple[datetime, int], asyncio.Event] = {}

    async def wait(self, slot: datetime, lane: int) -> None:
        """Wait before claiming *slot* in *lane*: until the draw's time after the first claim.

        Every claim of one (slot, lane) waits on one gate, opened by one timer, so they all
        wake in one turn of the event loop and go to the server in one batch
        (:mod:`._batch`). A claim that comes after the gate opened does not wait.
        """
        if not self._spread:
            return
        key = (slot, lane)
        gate = self._gates.get(key)
        if gate is None:
            if len(self._gates) >= 4096:  # forget the gates already open
                self._gates = {k: g for k, g in self._gates.items() if not g.is_set()}
            gate = self._gates[key] = asyncio.Event()
            asyncio.get_running_loop().call_later(self.delay(slot, lane), gate.set)
        if not gate.is_set():
            # An Event: each waiter waits on its own future (a cancelled one leaves the gate
            # to the others), and opening it wakes them all in one pass, in arrival order.
            await gate.wait()

    def delay(self, slot: datetime, lane: int) -> float:
        """Seconds to wait before claiming *slot* in *lane* (0 with ``spread=0``)."""
        if not self._spread:
            return 0.0
        digest = hashlib.blake2b(
            f"{slot.timestamp()!r}/{lane}".encode(), key=self._seed, digest_size=8
        ).digest()
        return self._spread * int.from_bytes(digest) / 2**64
