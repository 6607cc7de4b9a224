"""Where a ledger lives: its tables' names, quoted and qualified, and its lock keys; and,
until they move to the other modules of this folder, the statements of its reads and upkeep.

A ledger is one table of runs keyed by (job, slot) plus tables derived from its name (job
notes, control, leases, members, secrets, stored schedules). Every statement of the
package is parameterized; the only text spliced into SQL is identifiers, always through
:func:`quote_ident`. The schema and its migration are in :mod:`.schema`, a run's columns
and their decoding in :mod:`.runs`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..._errors import LedgerNameError
from ..._keys import job_lock_key, ledger_lock_key
from .runs import RUN, odd_list, real_start, sane, slot_in_range

# Kept for modules being restructured now, which still import them from here (issue 34,
# step 4); schema.py imports this module for typing only, so there is no cycle.
from .schema import ledger_state as ledger_state  # moved: postgres/_sql/schema.py
from .schema import migrate as migrate  # moved: postgres/_sql/schema.py

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
    """Where a ledger lives, and the statements that use it.

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
        assignment of claims, :mod:`._members`), quoted and qualified."""
        return self._qualified(_derived(self.table, "_members"))

    @property
    def secrets(self) -> str:
        """The secrets table (``<table>_secrets``: keys the fleet shares), quoted, qualified."""
        return self._qualified(_derived(self.table, "_secrets"))

    @property
    def schedules(self) -> str:
        """The stored schedules' table (``<table>_schedules``), quoted and qualified."""
        return self._qualified(_derived(self.table, "_schedules"))

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

    # -- writes that are not the hot path's (whose statements are in ._exclusion) --------

    @property
    def late_finish_sql(self) -> str:
        """Record outcomes of runs whose session died (no lock to release any more).

        Arrays: ``$1`` jobs, ``$2`` slots, ``$3`` outcomes, ``$4`` errors, ``$5`` times,
        ``$6`` attempts, ``$9`` when the runs began; ``$7`` host, ``$8`` pid: only this
        process's own claims are written. Another replica may have marked such a run
        ``"crashed"`` meanwhile (its session was gone): the real outcome replaces that,
        unless a rerun took the slot over (the row is then another attempt's).
        """
        return f"""
            UPDATE {self.runs} AS r
            SET finished_at = u.finished_at, outcome = u.outcome, error = u.error,
                started_at = {real_start("r.started_at", "u.started", "u.finished_at")}
            FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[],
                        $5::timestamptz[], $6::smallint[], $9::timestamptz[])
                 AS u(job, slot, outcome, error, finished_at, attempt, started)
            WHERE r.job = u.job AND r.slot = u.slot AND r.attempt = u.attempt
              AND r.host = $7::text AND r.pid = $8::integer
              AND (r.finished_at IS NULL OR r.outcome = 'crashed')"""

    # -- reads -----------------------------------------------------------------------------

    @property
    def last_claimed_sql(self) -> str:
        """``$1`` job: the latest slot any replica claimed."""
        return f"SELECT max(slot) FROM {self.runs} WHERE job = $1 AND {slot_in_range('slot')}"

    @property
    def last_runs_sql(self) -> str:
        """``$1`` job: rows ('last', latest finished run) and ('ok', latest success), and
        ('failed', latest failure); a row whose slot is out of range is none of them."""
        cols, sane_slot = RUN, slot_in_range("r.slot")
        return f"""
            (SELECT 'last' AS kind, {cols} FROM {self.runs} r WHERE job = $1
             AND finished_at IS NOT NULL AND {sane_slot} ORDER BY r.slot DESC LIMIT 1)
            UNION ALL
            (SELECT 'ok' AS kind, {cols} FROM {self.runs} r WHERE job = $1
             AND outcome = 'succeeded' AND {sane_slot} ORDER BY r.slot DESC LIMIT 1)
            UNION ALL
            (SELECT 'failed' AS kind, {cols} FROM {self.runs} r WHERE job = $1
             AND outcome <> 'succeeded' AND {sane_slot} ORDER BY r.slot DESC LIMIT 1)"""

    @property
    def history_sql(self) -> str:
        """``$1`` job, ``$2`` limit: the latest runs, newest first."""
        return f"""
            SELECT {RUN} FROM {self.runs} r WHERE job = $1 ORDER BY r.slot DESC LIMIT $2"""

    @property
    def jobs_sql(self) -> str:
        """Every job with a schedule note or a run: its schedule, tags, next slot, grace and
        due slot.

        Distinct jobs of the runs table come from a recursive skip scan of the primary
        key: one index probe per job, however many runs each has.
        """
        return f"""
            WITH RECURSIVE seen(job) AS (
                (SELECT job FROM {self.runs} ORDER BY job LIMIT 1)
                UNION ALL
                SELECT (SELECT r.job FROM {self.runs} r WHERE r.job > seen.job
                        ORDER BY r.job LIMIT 1)
                FROM seen WHERE seen.job IS NOT NULL
            )
            SELECT coalesce(j.job, s.job) AS job, j.schedule, j.tags,
                   {sane("j.next_run", "next_run")},
                   {sane("j.updated_at", "updated_at")}, j.grace, {sane("j.due", "due")},
                   {odd_list((f"j.{c}", c) for c in ("next_run", "updated_at", "due"))} AS odd
            FROM {self.jobs} j
            FULL JOIN (SELECT job FROM seen WHERE job IS NOT NULL) s ON s.job = j.job
            ORDER BY 1"""

    # -- upkeep -----------------------------------------------------------------------------

    @property
    def note_sql(self) -> str:
        """Upsert job schedules; arrays ``$1`` jobs, ``$2`` schedules, ``$3`` next slots,
        ``$5`` overdue graces in seconds, ``$6`` the slots they are due by, ``$8`` their tags
        (:func:`._upkeep.tags_json`); ``$4`` who writes, ``$7`` its margin in seconds (below). Rows
        already up to date are left alone.

        Replicas may give one job different graces (``alert_after``): the published one is
        the largest a replica still stands by. A grace stands until ``grace_until``: the
        next slot its replica noted, plus the grace, plus the margin (twice the longest
        that replica takes to write a changed note). Each replica writes its note again
        once that slot fires, so a replica alive keeps its grace standing; a lower grace
        replaces a larger one only once the larger stands no more (every replica that gave
        it stopped, or lowered it: a deploy that lowers ``alert_after`` takes effect about
        one slot later), an equal or larger one at once. So the overdue verdict never
        depends on which replica wrote last: where two graces disagree (less than the
        larger one past the due slot) the larger one still stands.
        """
        kept = "(j.grace > coalesce(EXCLUDED.grace, '-Infinity') AND j.grace_until > now())"
        grace = f"CASE WHEN {kept} THEN j.grace ELSE EXCLUDED.grace END"
        until = f"""CASE WHEN {kept} THEN j.grace_until
                         WHEN j.grace = EXCLUDED.grace
                         THEN greatest(j.grace_until, EXCLUDED.grace_until)
                         ELSE EXCLUDED.grace_until END"""
        return f"""
            INSERT INTO {self.jobs} AS j
                (job, schedule, next_run, updated_at, updated_by, grace, due, grace_until, tags)
            SELECT u.job, u.schedule, u.next_run, clock_timestamp(), $4::text, u.grace, u.due,
                   greatest(u.next_run, now())
                   + (u.grace + $7::float8) * interval '1 second',
                   ARRAY(SELECT jsonb_array_elements_text(u.tags::jsonb))
            FROM unnest($1::text[], $2::text[], $3::timestamptz[], $5::float8[],
                        $6::timestamptz[], $8::text[])
                 AS u(job, schedule, next_run, grace, due, tags)
            ON CONFLICT (job) DO UPDATE
            SET schedule = EXCLUDED.schedule, next_run = EXCLUDED.next_run,
                updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by,
                grace = {grace}, grace_until = {until}, due = EXCLUDED.due,
                tags = EXCLUDED.tags
            WHERE j.schedule IS DISTINCT FROM EXCLUDED.schedule
               OR j.next_run IS DISTINCT FROM EXCLUDED.next_run
               OR j.grace IS DISTINCT FROM {grace}
               OR j.grace_until IS DISTINCT FROM {until}
               OR j.due IS DISTINCT FROM EXCLUDED.due
               OR j.tags IS DISTINCT FROM EXCLUDED.tags"""

    @property
    def prune_sql(self) -> str:
        """Delete up to ``$2`` rows whose slot is older than ``$1`` seconds ago.

        Each job's latest run and latest success are kept whatever their age, so a job
        that runs monthly, or has failed for longer than the retention, still shows them
        and catch-up still knows where it stopped. Batched so that it never holds the
        shared lock session for long; the caller prunes again soon when a batch was full.
        """
        return f"""
            WITH doomed AS (
                SELECT r.job, r.slot FROM {self.runs} r
                WHERE r.slot < clock_timestamp() - $1::float8 * interval '1 second'
                  AND EXISTS (SELECT 1 FROM {self.runs} n
                              WHERE n.job = r.job AND n.slot > r.slot)
                  AND (r.outcome IS DISTINCT FROM 'succeeded'
                       OR EXISTS (SELECT 1 FROM {self.runs} s
                                  WHERE s.job = r.job AND s.slot > r.slot
                                    AND s.outcome = 'succeeded'))
                LIMIT $2
            ), gone AS (
                DELETE FROM {self.runs} r USING doomed d
                WHERE r.job = d.job AND r.slot = d.slot
                RETURNING 1
            )
            SELECT count(*) FROM gone"""
