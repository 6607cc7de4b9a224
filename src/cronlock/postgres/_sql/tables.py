"""Where a ledger lives: its tables' names, quoted and qualified, and its lock keys.

A ledger is one table of runs keyed by (job, slot) plus tables derived from its name (job
notes, control, leases, members, secrets, stored schedules, definitions). Every statement of the
package is parameterized; the only text spliced into SQL is identifiers, always through
:func:`quote_ident`. The statements are in the other modules of this folder, named for
what they do: the schema and its migration in :mod:`.schema`, runs in :mod:`.runs`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..._errors import LedgerNameError
from ..._keys import job_lock_key, ledger_lock_key

# Kept for modules being restructured now, which still import them from here (issue 34,
# step 4); schema.py imports this module for typing only, so there is no cycle.

__all__ = ("DEFAULT_TABLE", "LedgerTable", "quote_ident")

DEFAULT_TABLE = "cronlock_runs"
"""The run ledger's table name when none is given (its other tables derive from it)."""
# PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes; a longer name would silently
# become another name, so it is refused instead.
_MAX_IDENTIFIER = 63


def quote_ident(name: str, *, field: str = "identifier") -> str:
    """Quote *name* as a PostgreSQL identifier: ``"..."`` with inner quotes doubled.

    Any name PostgreSQL accepts is accepted, including spaces, quotes, capitals and
    non-ASCII letters. Refused: a non-string, the empty name, a NUL character (the
    server cannot store one) and names over 63 bytes (the server would truncate them).
    """
    if not isinstance(name, str) or not name:
        raise LedgerNameError(f"{field} must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise LedgerNameError(f"{field} {name!r} contains a NUL character")
    if len(name.encode()) > _MAX_IDENTIFIER:
        raise LedgerNameError(
            f"{field} {name!r} is {len(name.encode())} bytes long; PostgreSQL keeps at most "
            f"{_MAX_IDENTIFIER}"
        )
    return '"' + name.replace('"', '""') + '"'


def _derived(table: str, suffix: str) -> str:
    """``<table><suffix>``, shortened with a hash when it would exceed 63 bytes."""
    name = table + suffix
    if len(name.encode()) <= _MAX_IDENTIFIER:
        return name
    digest = hashlib.blake2b(table.encode(), digest_size=4).hexdigest()
    room = _MAX_IDENTIFIER - len(suffix) - len(digest) - 1
    head = table.encode()[:room].decode(errors="ignore")
    return f"{head}_{digest}{suffix}"


@dataclass(frozen=True, slots=True)
class LedgerTable:
    """Where a ledger lives: the names of its tables.

    *schema* ``None`` leaves the names unqualified, resolved through the session's
    ``search_path`` (the first schema in it when creating); name a schema when the
    application and the operator's command line could see different search paths.
    """

    table: str = DEFAULT_TABLE
    schema: str | None = None

    def __post_init__(self) -> None:
        quote_ident(self.table, field="ledger table")
        if self.schema is not None:
            quote_ident(self.schema, field="ledger schema")

    def _qualified(self, name: str) -> str:
        quoted = quote_ident(name, field="ledger table")
        if self.schema is None:
            return quoted
        return f"{quote_ident(self.schema, field='ledger schema')}.{quoted}"

    @property
    def runs(self) -> str:
        """The runs table, quoted and qualified: ``"schema"."table"``."""
        return self._qualified(self.table)

    @property
    def jobs(self) -> str:
        """The job schedules table (``<table>_jobs``), quoted and qualified."""
        return self._qualified(_derived(self.table, "_jobs"))

    @property
    def control(self) -> str:
        """The fleet control table (``<table>_control``: pauses, triggers), quoted and
        qualified."""
        return self._qualified(_derived(self.table, "_control"))

    @property
    def leases(self) -> str:
        """The leases table (``<table>_leases``: who runs each job, until when, in lease
        mode), quoted and qualified."""
        return self._qualified(_derived(self.table, "_leases"))

    @property
    def members(self) -> str:
        """The members table (``<table>_members``: the live replicas of the fleet, for the
        assignment of claims, ``_locker/members.py``), quoted and qualified."""
        return self._qualified(_derived(self.table, "_members"))

    @property
    def secrets(self) -> str:
        """The secrets table (``<table>_secrets``: keys the fleet shares), quoted, qualified."""
        return self._qualified(_derived(self.table, "_secrets"))

    @property
    def definitions(self) -> str:
        """The definitions table (``<table>_definitions``: each live replica's definition of
        each of its jobs, to tell two definitions under one name, ``_sql/definitions.py``),
        quoted and qualified."""
        return self._qualified(_derived(self.table, "_definitions"))

    @property
    def schedules(self) -> str:
        """The stored schedules' table (``<table>_schedules``), quoted and qualified."""
        return self._qualified(_derived(self.table, "_schedules"))

    @property
    def slots(self) -> str:
        """The slots' fates table (``<table>_slots``): the slots that did not run, each
        range with its fate and reason (:mod:`.slots`), quoted and qualified."""
        return self._qualified(_derived(self.table, "_slots"))

    def lock_key(self, job: str) -> int:
        """*job*'s advisory-lock key in this ledger's namespace (:func:`ledger_lock_key` of
        the qualified runs table): two ledgers in one database never share a key."""
        return ledger_lock_key(self.runs, job)

    @property
    def migrate_key(self) -> int:
        """The transaction advisory lock key that serialises concurrent migrations."""
        return job_lock_key(f"cronlock:migrate:{self.runs}")

    @property
    def quoted_schema(self) -> str | None:
        """The schema, quoted (``None``: the names are resolved through ``search_path``)."""
        return None if self.schema is None else quote_ident(self.schema)

    def index(self, suffix: str) -> str:
        """The quoted name of the ledger's index ``<table><suffix>`` (an index lives in its
        table's schema, so it is not qualified)."""
        return quote_ident(_derived(self.table, suffix))
