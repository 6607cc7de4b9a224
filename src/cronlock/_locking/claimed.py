"""Which claimed slots a locker remembers: the latest *remember* of each job.

A locker keeps the slots it claimed, per job, so that it can answer ``"already_ran"`` by
itself; it keeps a bounded number of them and forgets the earliest claims first. The
lockers share this rule rather than each spelling it out. This module depends on nothing
else in cronlock.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ("remember_claim",)

_S = TypeVar("_S")
_V = TypeVar("_V")


def remember_claim(claimed: dict[_S, _V], slot: _S, value: _V, *, remember: int) -> None:
    """Add *slot* (with *value*) to *claimed*, then forget claims beyond *remember*.

    *claimed* holds one job's claims in the order they were made (a dict keeps insertion
    order), so the ones forgotten are the earliest claimed.
    """
    claimed[slot] = value
    while len(claimed) > remember:
        del claimed[next(iter(claimed))]
