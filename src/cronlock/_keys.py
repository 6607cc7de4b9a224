"""Lock keys: a job name mapped to the bigint that PostgreSQL advisory locks take."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

__all__ = ("job_lock_key", "keyed_lock_key", "ledger_keys", "ledger_lock_key")

# FNV-1a, 64-bit variant: http://www.isthe.com/chongo/tech/comp/fnv/ (parameters public).
_FNV64_OFFSET_BASIS = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF
_SIGN_BIT = 0x8000000000000000


def _fnv1a(h: int, data: bytes) -> int:
    """FNV-1a 64 from state *h* over *data* (the unsigned state after it)."""
    for byte in data:
        # xor first, then multiply: that order is what makes it FNV-1a rather than FNV-1.
        h = ((h ^ byte) * _FNV64_PRIME) & _MASK64
    return h


def job_lock_key(name: str) -> int:
    """Return the advisory-lock key of job *name*: FNV-1a 64 of its UTF-8 bytes, as int64.

    The unsigned 64-bit hash is reinterpreted as a two's-complement signed integer, which is
    bit for bit what Go computes with ``int64(fnv.New64a().Sum64())``. A Go service and a
    cronlock service that name a job alike therefore contend for the same PostgreSQL lock.
    The value fits PostgreSQL's ``bigint``: ``job_lock_key("") == -3750763034362895579``.
    """
    h = _fnv1a(_FNV64_OFFSET_BASIS, name.encode("utf-8"))
    return h - (1 << 64) if h & _SIGN_BIT else h


def ledger_lock_key(ledger: str, name: str) -> int:
    """The advisory-lock key of job *name* of the ledger named *ledger*.

    Advisory locks are database-wide: two services with ledgers of their own in one database
    that both name a job "cleanup" would block each other on :func:`job_lock_key`. This key
    hashes the ledger's name too (``job_lock_key(ledger + "\\0" + name)``: a NUL never
    occurs in a name the server stores), so each ledger's jobs contend only among themselves.
    """
    return job_lock_key(f"{ledger}\x00{name}")


def keyed_lock_key(secret: bytes, name: str) -> int:
    """The advisory-lock key of job *name* under *secret*: the first 8 bytes of
    HMAC-SHA256(*secret*, UTF-8 *name*), big-endian, as a signed int64.

    FNV-1a is not a keyed hash: whoever chooses a job's name can search for another name
    with the same key (minutes on a laptop), and a job of that name then holds the first
    one off. Without the secret no name can be aimed at another's key.
    """
    digest = hmac.new(secret, name.encode("utf-8"), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def ledger_keys(ledger: str) -> Callable[[str], int]:
    """:func:`ledger_lock_key` of *ledger* as a function of the job's name, the ledger's
    part hashed once (FNV-1a reads its input in order: the state after ``ledger + "\\0"``
    is where every job's key of the ledger starts)."""
    start = _fnv1a(_FNV64_OFFSET_BASIS, f"{ledger}\x00".encode())

    def key(name: str) -> int:
        h = _fnv1a(start, name.encode("utf-8"))
        return h - (1 << 64) if h & _SIGN_BIT else h

    return key
