"""The ledger's schema: every table's DDL, the migration that applies it, and the catalog
read that tells a current ledger from a missing or older one.

A ledger is one table of runs keyed by (job, slot) plus the tables derived from its name
(:class:`.tables.LedgerTable`): job notes, fleet control, leases, members, secrets, stored
schedules and the replicas' job definitions. Every statement here is idempotent, and an
upgraded ledger still works for older replicas (new columns have defaults), so replicas can
be upgraded one at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ..._errors import LockerMisconfigured
from .runs import slot_in_range

if TYPE_CHECKING:  # tables.py re-exports migrate and ledger_state from here, for now
    from .tables import LedgerTable

__all__ = (
    "CURRENT_USER_SQL",
    "DESCRIBE_SERVER_SQL",
    "DROP_LOCK_TIMEOUT_SQL",
    "LEDGER_STATE_SQL",
    "MIGRATE_LOCK_SQL",
    "READABLE_TABLE_SQL",
    "SCHEMA_EXISTS_SQL",
    "TABLES_EXIST_SQL",
    "TABLE_EXISTS_SQL",
    "LedgerState",
    "create_schema_sql",
    "definitions_ddl",
    "drop_schema_sql",
    "first_seen_ddl",
    "first_seen_sql",
    "ledger_ddl",
    "ledger_state",
    "lock_timeout_sql",
    "migrate",
    "schedules_ddl",
)

# The columns of the runs and jobs tables a ledger made by an older cronlock lacks (no name
# is in both tables); migrate() adds them.
_ADDED_COLUMNS = (
    *("session", "attempt", "manual", "grace", "due", "grace_until", "first_seen", "tags"),
    *("holder", "attempts", "retired_at"),
    "retry_at",
    "spec",
)


@runtime_checkable
class _Answer(Protocol):
    """An error answer of the server: its SQLSTATE (this folder imports no backend)."""

    sqlstate: str


def _permission_denied(exc: BaseException) -> bool:
    """Whether *exc* is the server refusing a privilege (SQLSTATE 42501): on the database, a
    schema or a table, or a DDL statement of a table the role does not own."""
    return isinstance(exc, _Answer) and exc.sqlstate == "42501"


LedgerState = Literal["missing", "old", "current"]
"""A ledger's tables are missing, lack a table or column this cronlock uses, or are current."""

TABLE_EXISTS_SQL = "SELECT to_regclass($1) IS NOT NULL"
"""``$1`` a quoted, maybe qualified table name: whether this session resolves it to a table."""
TABLES_EXIST_SQL = "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL"
"""``$1``, ``$2`` quoted, maybe qualified table names: whether each is a table here."""

READABLE_TABLE_SQL = """
    SELECT CASE WHEN to_regclass($1) IS NOT NULL
                THEN has_table_privilege(to_regclass($1), 'SELECT') ELSE false END,
           to_regclass($2) IS NOT NULL"""
"""``$1``, ``$2`` quoted, maybe qualified table names: whether the first is a table here
that this session's role may read (a reader may not read the secrets table), whether the
second is a table here."""

LEDGER_STATE_SQL = """
            SELECT CASE WHEN to_regclass($1) IS NULL OR to_regclass($2) IS NULL THEN NULL
                   ELSE (SELECT count(*) = cardinality($3::text[]) FROM pg_attribute
                         WHERE attrelid IN (to_regclass($1), to_regclass($2))
                           AND attname = ANY($3::text[])
                           AND NOT attisdropped)
                        AND NOT EXISTS (SELECT FROM unnest($4::text[]) AS t(name)
                                        WHERE to_regclass(t.name) IS NULL) END"""
"""``$1``, ``$2``: the quoted names of the runs and jobs tables, ``$3`` the columns a
current ledger has in them that an old one lacks, ``$4`` the tables an older ledger lacks
(control, leases, members, secrets, schedules, definitions, slots). NULL when a table is missing,
else whether it is current."""

CURRENT_USER_SQL = "SELECT current_user"
"""No parameters: the role this session runs as (who an operator's change is recorded by)."""

DESCRIBE_SERVER_SQL = (
    "SELECT current_setting('server_version') AS version, current_database() AS db"
)
"""No parameters: the server's version and database, as the server sees them. Not its
address: through a pooler that is the server's behind it, which would hide the pooler
(the demo names the DSN's)."""

DROP_LOCK_TIMEOUT_SQL = "SET LOCAL lock_timeout = '10s'"
"""No parameters: the transaction waits at most 10 s for a lock (before dropping a schema
that a process may still use); local to it, so a pooler never hands it on."""

SCHEMA_EXISTS_SQL = "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1::text)"
"""``$1`` a schema's name (unquoted): whether it exists (seen without any privilege)."""

MIGRATE_LOCK_SQL = "SELECT pg_advisory_xact_lock($1::bigint)"
"""``$1`` :attr:`.tables.LedgerTable.migrate_key`: the transaction lock that serialises
concurrent migrations of one ledger."""


def lock_timeout_sql(timeout: float) -> str:
    """The ``SET LOCAL lock_timeout`` of a migration that waits at most *timeout* seconds
    for a lock (no parameters: ``SET`` takes none)."""
    return f"SET LOCAL lock_timeout = {int(timeout * 1000)}"


def create_schema_sql(table: LedgerTable) -> str:
    """No parameters: create *table*'s schema (it must name one), sent only when
    :data:`SCHEMA_EXISTS_SQL` says it is missing."""
    if table.quoted_schema is None:
        raise ValueError("create_schema_sql: the ledger names no schema")
    return f"CREATE SCHEMA IF NOT EXISTS {table.quoted_schema}"


def drop_schema_sql(table: LedgerTable) -> str:
    """No parameters: drop *table*'s schema (it must name one) and everything in it, the
    ledger included (the demo's throwaway ledger)."""
    if table.quoted_schema is None:
        raise ValueError("drop_schema_sql: the ledger names no schema")
    return f"DROP SCHEMA IF EXISTS {table.quoted_schema} CASCADE"


def ledger_ddl(table: LedgerTable) -> list[str]:
    """The statements that create *table*'s ledger in its schema, each idempotent (no
    parameters). Not the schema: :func:`migrate` makes it only when it is missing
    (``CREATE SCHEMA IF NOT EXISTS`` needs CREATE on the database even when the schema is
    there, which a role that owns its schema seldom has)."""
    runs, jobs = table.runs, table.jobs
    return [
        f"""CREATE TABLE IF NOT EXISTS {runs} (
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
                holder      text,
                attempts    jsonb,
                retry_at    timestamptz,
                PRIMARY KEY (job, slot)
            )""",
        # A ledger made by an older cronlock: add what it lacks (no table rewrite: the
        # default is a constant; an older replica's claims leave manual false).
        f"""ALTER TABLE {runs}
                ADD COLUMN IF NOT EXISTS session integer,
                ADD COLUMN IF NOT EXISTS attempt smallint NOT NULL DEFAULT 1,
                ADD COLUMN IF NOT EXISTS manual boolean NOT NULL DEFAULT false""",
        # The locker that claimed a run (its members row: whether its owner is alive, for
        # the crash check); NULL in a row an older cronlock claimed.
        f"ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS holder text",
        # A retried or rerun slot's earlier attempts, oldest first, as the takeover that
        # replaced each found it (_sql/crashes.KEPT_ATTEMPTS); NULL for a slot tried once.
        # An older cronlock's takeover leaves it as it is.
        f"ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS attempts jsonb",
        # When the retry of a failed attempt is due (the attempt is the row's plus one),
        # written by the replica that will retry it: another one takes the retry over if
        # that replica is gone by then (_sql/crashes.retries_due_sql); NULL otherwise.
        f"ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS retry_at timestamptz",
        f"""CREATE INDEX IF NOT EXISTS {table.index("_retry_idx")} ON {runs} (retry_at)
                WHERE retry_at IS NOT NULL""",
        # For pruning by age across jobs; (job, slot) lookups use the primary key.
        f"CREATE INDEX IF NOT EXISTS {table.index('_slot_idx')} ON {runs} (slot)",
        # The crash check reads only the unfinished runs, a handful however many runs.
        f"""CREATE INDEX IF NOT EXISTS {table.index("_unfinished_idx")} ON {runs} (session)
                WHERE finished_at IS NULL""",
        f"""CREATE TABLE IF NOT EXISTS {jobs} (
                job        text        PRIMARY KEY,
                schedule   text        NOT NULL,
                next_run   timestamptz,
                updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                updated_by text
            )""",
        # Each job's overdue grace and due slot, for 'status --check' (added later), and
        # until when that grace stands against a lower one (_sql/upkeep.note_sql).
        f"""ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS grace float8,
                ADD COLUMN IF NOT EXISTS due timestamptz,
                ADD COLUMN IF NOT EXISTS grace_until timestamptz""",
        *first_seen_ddl(table),  # when each job was first noted
        # Each job's tags as its replicas note them (the dashboard's filter); NULL in a
        # row an older cronlock wrote.
        f"ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS tags text[]",
        # When an operator retired the job and who (FleetControl.retire): the readers leave
        # it out until a replica notes it again (_sql/upkeep.note_sql clears it).
        f"""ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS retired_at timestamptz,
                ADD COLUMN IF NOT EXISTS retired_by text""",
        # Fleet control (FleetControl, _sql/control.py): pauses and triggers.
        f"""CREATE TABLE IF NOT EXISTS {table.control} (
                job          text        PRIMARY KEY,
                paused_at    timestamptz,
                paused_by    text,
                trigger_slot timestamptz,
                triggered_by text,
                updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
            )""",
        # Lease mode (_sql/leases.py): one row a job, naming the run that holds it and until
        # when, in the server's time. A lease released is one that expired at -infinity.
        f"""CREATE TABLE IF NOT EXISTS {table.leases} (
                job        text        PRIMARY KEY,
                slot       timestamptz NOT NULL,
                holder     text        NOT NULL,
                expires_at timestamptz NOT NULL,
                attempt    smallint    NOT NULL DEFAULT 1
            )""",
        # The fleet's live replicas (_locker/members.py), one row each, expiring in server time.
        f"""CREATE TABLE IF NOT EXISTS {table.members} (
                holder     text        PRIMARY KEY,
                fleet      text        NOT NULL,
                expires_at timestamptz NOT NULL,
                since      timestamptz NOT NULL DEFAULT clock_timestamp()
            )""",
        # The session a session-mode member beats on, and when the server it beat on
        # started (_sql/upkeep.heartbeat_sql): on that same server, that session gone is
        # its replica gone (_sql/crashes.sessions_gone); NULL in lease mode, or in a row an
        # older cronlock wrote.
        f"""ALTER TABLE {table.members} ADD COLUMN IF NOT EXISTS session integer,
                ADD COLUMN IF NOT EXISTS server_started timestamptz""",
        # How a reader of the ledger rebuilds each job's slots (history --slots): its
        # schedule, jitter, misfire_grace, start_at and stop_at as JSON (_core/slots/fate.py);
        # NULL for a schedule that cannot be written down, or in a row an older cronlock wrote.
        f"ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS spec jsonb",
        # The slots that did not run, a range a row, with their fate (coalesced into
        # into_slot, missed, skipped) and its reason, recorded by the replica that decided
        # it (_sql/slots.py); the first record of a range's first slot stands.
        f"""CREATE TABLE IF NOT EXISTS {table.slots} (
                job         text        NOT NULL,
                slot        timestamptz NOT NULL,
                last_slot   timestamptz NOT NULL,
                fate        text        NOT NULL,
                reason      text        NOT NULL,
                into_slot   timestamptz,
                holder      text,
                recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                PRIMARY KEY (job, slot)
            )""",
        # Keys every process of the fleet shares (_locker/secrets.py), made once by the first.
        f"""CREATE TABLE IF NOT EXISTS {table.secrets} (name text PRIMARY KEY,
                value bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        # Schedules the application adds at runtime (FleetControl.add_schedule).
        *schedules_ddl(table),
        *definitions_ddl(table),
    ]


def definitions_ddl(table: LedgerTable) -> list[str]:
    """The statements that create *table*'s definitions table (``<table>_definitions``,
    :mod:`.definitions`) and its indexes, each idempotent: one row per replica (its
    members' *holder*) and job, the job's definition (schedule and function) as that
    replica has it, written when the replica starts and when the definition changes."""
    definitions = table.definitions
    return [
        f"""CREATE TABLE IF NOT EXISTS {definitions} (
            job        text        NOT NULL,
            holder     text        NOT NULL,
            definition text        NOT NULL,
            noted_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (job, holder)
        )""",
        # The replicas' reads of what changed lately (_sql/definitions.conflicts_sql), and
        # a replica's rows (back from an outage; the cleanup of a gone one's).
        f"""CREATE INDEX IF NOT EXISTS {table.index("_definitions_noted_idx")}
                ON {definitions} (noted_at)""",
        f"""CREATE INDEX IF NOT EXISTS {table.index("_definitions_holder_idx")}
                ON {definitions} (holder)""",
    ]


def first_seen_ddl(table: LedgerTable) -> list[str]:
    """The idempotent statements that add ``first_seen`` to *table*'s jobs table: each
    job's first-seen instant, when a replica first noted it.

    A job that never succeeded has gone without success since then
    (``without_success_since``), however often its replicas restarted. The column's default
    sets it when a row is inserted (by any cronlock, older ones included) and nothing
    updates it afterwards. Rows that predate the column are filled once, with the earlier
    of their job's oldest run still in the runs table (its start) and the row's last note:
    the job existed then.
    """
    jobs, runs = table.jobs, table.runs
    oldest = f"SELECT r.started_at FROM {runs} r WHERE r.job = j.job ORDER BY r.slot LIMIT 1"
    return [
        f"ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS first_seen timestamptz",
        f"""UPDATE {jobs} AS j SET first_seen = least(({oldest}), j.updated_at)
            WHERE j.first_seen IS NULL""",
        f"ALTER TABLE {jobs} ALTER COLUMN first_seen SET DEFAULT clock_timestamp()",
    ]


def first_seen_sql(table: LedgerTable) -> str:
    """``$1`` job names: the first-seen instant of those of them *table*'s jobs table has
    (one Python cannot hold, a hostile row's, is left out: the replica counts from its start)."""
    return f"""SELECT job, first_seen FROM {table.jobs}
               WHERE job = ANY($1::text[]) AND {slot_in_range("first_seen")}"""


def schedules_ddl(table: LedgerTable) -> list[str]:
    """The statements that create *table*'s stored schedules' table (``<table>_schedules``,
    :mod:`.stored`) and its revision index, each idempotent."""
    schedules = table.schedules
    return [
        f"""CREATE TABLE IF NOT EXISTS {schedules} (
            name             text        PRIMARY KEY,
            revision         bigint      NOT NULL,
            removed          boolean     NOT NULL DEFAULT false,
            task             text        NOT NULL,
            schedule         jsonb       NOT NULL,
            kwargs           jsonb       NOT NULL DEFAULT '{{}}',
            options          jsonb       NOT NULL DEFAULT '{{}}',
            updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_by       text,
            problems         jsonb,
            problem_revision bigint
        )""",
        f"CREATE INDEX IF NOT EXISTS {table.index('_schedules_idx')} ON {schedules} (revision)",
    ]


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
    step = "read"
    state: LedgerState = "missing"
    try:
        async with conn.transaction():
            await conn.execute(lock_timeout_sql(timeout))
            await conn.execute(MIGRATE_LOCK_SQL, table.migrate_key)
            state = await _ledger_state(conn, table)
            if state == "current":
                return None  # another replica did it while we waited
            if table.schema is not None and not await conn.fetchval(
                SCHEMA_EXISTS_SQL, table.schema
            ):
                step = "schema"
                await conn.execute(create_schema_sql(table))
            step = state
            for statement in ledger_ddl(table):
                await conn.execute(statement)
    except Exception as exc:
        if not _permission_denied(exc):
            raise
        raise LockerMisconfigured(_denied(table, step, await _current_user(conn), exc)) from exc
    return "created" if state == "missing" else "upgraded"


async def _current_user(conn: Any) -> str:
    try:
        return str(await conn.fetchval(CURRENT_USER_SQL))
    except Exception:  # the session is gone: the message does without the name
        return "this role"


def _denied(table: LedgerTable, step: str, user: str, exc: BaseException) -> str:
    """What a migration refused at *step* (``read``: looking at the ledger; ``schema``:
    creating its schema; ``missing``: creating its tables; ``old``: upgrading them) lacks."""
    said = f"the server said: {exc}"
    schema = table.quoted_schema or "the search path's first schema"
    if step == "read":
        return (
            f"cannot look at the run ledger {table.runs}: role {user} lacks USAGE on schema "
            f"{schema} ({said}); grant it ('python -m cronlock grants' prints what each role "
            "needs)"
        )
    if step == "schema":
        return (
            f"cannot create schema {schema} for the run ledger: role {user} lacks CREATE on "
            f"the database ({said}); have an administrator create it (CREATE SCHEMA {schema} "
            f"AUTHORIZATION {user}) or grant CREATE on the database"
        )
    if step == "missing":
        return (
            f"cannot create the run ledger {table.runs}: role {user} lacks CREATE on schema "
            f"{schema} ({said}); grant CREATE on it, or create the ledger with 'python -m "
            "cronlock migrate' as a role that has it (the schema's owner)"
        )
    return (
        f"cannot upgrade the run ledger {table.runs}: only the owner of its tables may, and "
        f"role {user} is not ({said}); run 'python -m cronlock migrate' as their owner"
    )


async def ledger_state(conn: Any, table: LedgerTable) -> LedgerState:
    """Whether the ledger's tables are missing, of an older shape, or current, as this
    session resolves their names: one catalog query. A role without USAGE on the ledger's
    schema is refused with :class:`cronlock.LockerMisconfigured`, naming the grant."""
    try:
        return await _ledger_state(conn, table)
    except Exception as exc:
        if not _permission_denied(exc):
            raise
        raise LockerMisconfigured(_denied(table, "read", await _current_user(conn), exc)) from exc


async def _ledger_state(conn: Any, table: LedgerTable) -> LedgerState:
    current = await conn.fetchval(
        LEDGER_STATE_SQL,
        table.runs,
        table.jobs,
        list(_ADDED_COLUMNS),
        [
            *(table.control, table.leases, table.members, table.secrets, table.schedules),
            table.definitions,
            table.slots,
        ],
    )
    return "missing" if current is None else "current" if current else "old"
