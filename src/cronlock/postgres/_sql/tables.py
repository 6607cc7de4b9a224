"""The run ledger's SQL: table names, quoting, schema migration, statements.

A ledger is one table of runs keyed by (job, slot) plus a small table of job schedules.
Every statement here is parameterized; the only text spliced into SQL is identifiers,
always through :func:`quote_ident`. The locker and the ledger verbs of the command line
run them. A run's columns and their decoding live in :mod:`._decode` (re-exported here).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from ..._errors import LedgerNameError
from ..._keys import job_lock_key, ledger_lock_key
from .decode import R_RUN, RUN, RUN_COLUMNS, odd_list, sane, slot_in_range, to_record
from .firstseen import first_seen_ddl
from .starts import real_start
from .storedddl import schedules_ddl

__all__ = (
    "DEFAULT_TABLE",
    "RUN",
    "RUN_COLUMNS",
    "R_RUN",
    "LedgerState",
    "LedgerTable",
    "ledger_state",
    "migrate",
    "quote_ident",
    "tables_exist",
    "to_record",
)

DEFAULT_TABLE = "cronlock_runs"
"""The run ledger's table name when none is given (its other tables derive from it)."""
# PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes; a longer name would silently
# become another name, so it is refused instead.
_MAX_IDENTIFIER = 63
# The columns of the runs and jobs tables a ledger made by an older cronlock lacks (no name
# is in both tables); migrate() adds them.
_ADDED_COLUMNS = (
    *("session", "attempt", "manual", "grace", "due", "grace_until", "first_seen", "tags"),
)

LedgerState = Literal["missing", "old", "current"]
"""A ledger's tables are missing, lack a table or column this cronlock uses, or are current."""


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

    # -- schema ------------------------------------------------------------------------

    def ddl(self) -> list[str]:
        """The statements that create the ledger, each idempotent."""
        slot_index = quote_ident(_derived(self.table, "_slot_idx"))
        unfinished_index = quote_ident(_derived(self.table, "_unfinished_idx"))
        statements = []
        if self.schema is not None:
            statements.append(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self.schema)}")
        statements += [
            f"""CREATE TABLE IF NOT EXISTS {self.runs} (
                job         text        NOT NULL,
                slot        timestamptz NOT NULL,
                host        text        NOT NULL,
                pid         integer     NOT NULL,
                started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                finished_at timestamptz,
                outcome     text,
                error       text,
                session     integer,
                attempt     smallint    NOT NULL DEFAULT 1,
                manual      boolean     NOT NULL DEFAULT false,
                PRIMARY KEY (job, slot)
            )""",
            # A ledger made by an older cronlock: add what it lacks (no table rewrite: the
            # default is a constant; an older replica's claims leave manual false).
            f"""ALTER TABLE {self.runs}
                ADD COLUMN IF NOT EXISTS session integer,
                ADD COLUMN IF NOT EXISTS attempt smallint NOT NULL DEFAULT 1,
                ADD COLUMN IF NOT EXISTS manual boolean NOT NULL DEFAULT false""",
            # For pruning by age across jobs; (job, slot) lookups use the primary key.
            f"CREATE INDEX IF NOT EXISTS {slot_index} ON {self.runs} (slot)",
            # The crash check reads only the unfinished runs, a handful however many runs.
            f"""CREATE INDEX IF NOT EXISTS {unfinished_index} ON {self.runs} (session)
                WHERE finished_at IS NULL""",
            f"""CREATE TABLE IF NOT EXISTS {self.jobs} (
                job        text        PRIMARY KEY,
                schedule   text        NOT NULL,
                next_run   timestamptz,
                updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                updated_by text
            )""",
            # Each job's overdue grace and due slot, for 'status --check' (added later), and
            # until when that grace stands against a lower one (note_sql).
            f"""ALTER TABLE {self.jobs} ADD COLUMN IF NOT EXISTS grace float8,
                ADD COLUMN IF NOT EXISTS due timestamptz,
                ADD COLUMN IF NOT EXISTS grace_until timestamptz""",
            *first_seen_ddl(self.jobs, self.runs),  # when each job was first noted
            # Each job's tags as its replicas note them (the dashboard's filter); NULL in a
            # row an older cronlock wrote.
            f"ALTER TABLE {self.jobs} ADD COLUMN IF NOT EXISTS tags text[]",
            # Fleet control (FleetControl, ._control): pauses and triggers.
            f"""CREATE TABLE IF NOT EXISTS {self.control} (
                job          text        PRIMARY KEY,
                paused_at    timestamptz,
                paused_by    text,
                trigger_slot timestamptz,
                triggered_by text,
                updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
            )""",
            # Lease mode (._leasesql): one row a job, naming the run that holds it and until
            # when, in the server's time. A lease released is one that expired at -infinity.
            f"""CREATE TABLE IF NOT EXISTS {self.leases} (
                job        text        PRIMARY KEY,
                slot       timestamptz NOT NULL,
                holder     text        NOT NULL,
                expires_at timestamptz NOT NULL,
                attempt    smallint    NOT NULL DEFAULT 1
            )""",
            # The fleet's live replicas (._members), one row each, expiring in server time.
            f"""CREATE TABLE IF NOT EXISTS {self.members} (
                holder     text        PRIMARY KEY,
                fleet      text        NOT NULL,
                expires_at timestamptz NOT NULL,
                since      timestamptz NOT NULL DEFAULT clock_timestamp()
            )""",
            # Keys every process of the fleet shares (._secrets), made once by the first.
            f"""CREATE TABLE IF NOT EXISTS {self.secrets} (name text PRIMARY KEY,
                value bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
            # Schedules the application adds at runtime (FleetControl.add_schedule).
            *schedules_ddl(self.schedules, quote_ident(_derived(self.table, "_schedules_idx"))),
        ]
        return statements

    @property
    def state_sql(self) -> str:
        """``$1, $2``: the quoted names of the runs and jobs tables, ``$3`` the columns a
        current ledger has in them that an old one lacks, ``$4`` the tables an older ledger
        lacks (control, leases, members, secrets, schedules). NULL when a table is missing, else
        whether it is current.
        """
        return """
            SELECT CASE WHEN to_regclass($1) IS NULL OR to_regclass($2) IS NULL THEN NULL
                   ELSE (SELECT count(*) = cardinality($3::text[]) FROM pg_attribute
                         WHERE attrelid IN (to_regclass($1), to_regclass($2))
                           AND attname = ANY($3::text[])
                           AND NOT attisdropped)
                        AND NOT EXISTS (SELECT FROM unnest($4::text[]) AS t(name)
                                        WHERE to_regclass(t.name) IS NULL) END"""

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


async def migrate(
    conn: Any, table: LedgerTable, *, timeout: float = 30.0
) -> Literal["created", "upgraded"] | None:
    """Create the ledger's tables if missing, or add what a ledger made by an older
    cronlock lacks, in one transaction; return what it did (``None``: nothing to do).

    Concurrent callers (replicas starting together) are serialised with a transaction
    advisory lock, since concurrent ``CREATE TABLE IF NOT EXISTS`` of one name can fail;
    the state is checked again under it. A current ledger is detected first, so a role
    without CREATE rights on the schema can use a ledger someone else made. Every
    statement is idempotent, and an upgraded ledger still works for older replicas (the
    new columns have defaults), so replicas can be upgraded one at a time.
    """
    if await ledger_state(conn, table) == "current":
        return None
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = {int(timeout * 1000)}")
        await conn.execute("SELECT pg_advisory_xact_lock($1::bigint)", table.migrate_key)
        state = await ledger_state(conn, table)
        if state == "current":
            return None  # another replica did it while we waited
        for statement in table.ddl():
            await conn.execute(statement)
    return "created" if state == "missing" else "upgraded"


async def ledger_state(conn: Any, table: LedgerTable) -> LedgerState:
    """Whether the ledger's tables are missing, of an older shape, or current, as this
    session resolves their names: one catalog query."""
    current = await conn.fetchval(
        table.state_sql,
        table.runs,
        table.jobs,
        list(_ADDED_COLUMNS),
        [table.control, table.leases, table.members, table.secrets, table.schedules],
    )
    return "missing" if current is None else "current" if current else "old"


async def tables_exist(conn: Any, table: LedgerTable) -> bool:
    """Whether the ledger's runs and jobs tables exist (as this session resolves their names)."""
    return await ledger_state(conn, table) != "missing"
