"""Which advisory-lock key a job gets (``PostgresLocker(lock_keys=...)``).

``"fnv1a"`` (the default): FNV-1a 64 of the ledger's name and the job's
(:func:`~cronlock.postgres.ledger_lock_key`), or of the job's alone with ``bare_keys=True``,
as Go computes it. Anyone can compute these keys, and whoever names a job can search for a
name with another job's key.

``"keyed"``: :func:`cronlock._keys.keyed_lock_key` under a secret of the ledger's, made by
the first replica in ``<table>_secrets`` (``"lock.keys"``) and read by every other one, so
every replica of a ledger computes the same keys and nobody without read access to that
table can aim a name at one. The secret is read before the locker's first claim; until
then :meth:`KeySource.key` raises :class:`cronlock.LockError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ..._errors import ConfigError, LockError
from ..._keys import job_lock_key, keyed_lock_key, ledger_keys
from .._sql.tables import LedgerTable
from .secrets import fleet_secret

__all__ = ("SECRET_NAME", "KeySource", "LockKeys")

LockKeys = Literal["fnv1a", "keyed"]
SECRET_NAME = "lock.keys"
"""The name of the keyed lock keys' secret in ``<table>_secrets``."""


class KeySource:
    """One locker's key function, and for ``"keyed"`` the secret it reads first."""

    def __init__(self, kind: LockKeys, namespace: LedgerTable | None) -> None:
        """*namespace*: the ledger whose keys these are, or ``None`` for bare keys (Go's
        ``job_lock_key``: ``bare_keys=True``, or no ledger)."""
        if kind not in ("fnv1a", "keyed"):
            raise ConfigError(f"PostgresLocker: lock_keys must be 'fnv1a' or 'keyed', got {kind!r}")
        if kind == "keyed" and namespace is None:
            raise ConfigError(
                "PostgresLocker: lock_keys='keyed' keeps its secret in the ledger, and its "
                "keys are nobody else's: it takes neither ledger=False nor bare_keys=True"
            )
        self.namespace, self.kind = namespace, kind
        # namespace.lock_key, with the ledger's name quoted and hashed once, not per claim.
        self.fnv: Callable[[str], int] = (
            job_lock_key if namespace is None else ledger_keys(namespace.runs)
        )
        """FNV-1a keys, which need nothing read: what spreads jobs over the sessions too."""
        self._secret: bytes | None = None
        self._loading = asyncio.Lock()
        self.ready = kind == "fnv1a"
        """Whether :meth:`key` answers without :meth:`load` first."""
        self.key: Callable[[str], int] = self.fnv if self.ready else self._keyed

    def _keyed(self, job: str) -> int:
        if self._secret is None:
            raise LockError(
                f"job {job!r}: lock_keys='keyed': the key is known once the locker has read "
                "its ledger's secret, at its first claim"
            )
        return keyed_lock_key(self._secret, job)

    async def load(self, sessions: Sequence[Any]) -> None:
        """Read (or make) the ledger's secret, once; raises :class:`cronlock.LockError`."""
        async with self._loading:
            if self.ready:
                return
            namespace = self.namespace
            assert namespace is not None  # keyed keys have one (checked at construction)
            session = sessions[0]
            conn, generation = await session.ensure()
            self._secret = await session.run(
                conn,
                generation,
                lambda c: fleet_secret(c, namespace, SECRET_NAME),
                what="reading the ledger's lock-key secret",
                keep_on_server_error=True,
            )
            self.ready = True
