"""The statements of a locker's background duties: job notes, pruning, fleet membership,
the look at a foreign lock holder, the fleet's shared secrets, and the session heartbeat.

Each takes the ledger's :class:`.tables.LedgerTable` (or none, a constant) and lists its
``$n`` parameters; the services that send them live in ``postgres/_locker/``.
"""

from __future__ import annotations

from .tables import LedgerTable

__all__ = (
    "HEARTBEAT_SQL",
    "MEMBERS_EVERY",
    "MEMBER_TTL",
    "heartbeat_sql",
    "holders_sql",
    "leave_sql",
    "make_secret_sql",
    "note_sql",
    "prune_sql",
    "read_secret_sql",
)

MEMBERS_EVERY = 15.0
"""Seconds between two heartbeats of one replica in the members table."""
MEMBER_TTL = 3 * MEMBERS_EVERY
"""Seconds a member row lives without a heartbeat (and a replica trusts its last view). The
crash checks (:mod:`.crashes`, :mod:`.leases`) take a run's owner for gone only once its
row has been expired (or absent) this long after its claim."""

HEARTBEAT_SQL = "SELECT 1"
"""No parameters: the cheapest statement that proves a lock session still answers."""


def note_sql(table: LedgerTable) -> str:
    """Upsert job schedules; arrays ``$1`` jobs, ``$2`` schedules, ``$3`` next slots,
    ``$5`` overdue graces in seconds, ``$6`` the slots they are due by, ``$8`` their tags
    (``_locker/upkeep.tags_json``), ``$9`` how their slots are rebuilt (JSON text,
    ``_core/slots/fate.job_spec``; NULL keeps the row's); ``$4`` who writes, ``$7`` its
    margin in seconds (below).
    Rows already up to date are left alone; a retired job's row is written (a replica that
    notes the job announces it again: it is no longer retired).

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
        INSERT INTO {table.jobs} AS j
            (job, schedule, next_run, updated_at, updated_by, grace, due, grace_until, tags,
             spec)
        SELECT u.job, u.schedule, u.next_run, clock_timestamp(), $4::text, u.grace, u.due,
               greatest(u.next_run, now())
               + (u.grace + $7::float8) * interval '1 second',
               ARRAY(SELECT jsonb_array_elements_text(u.tags::jsonb)), u.spec::jsonb
        FROM unnest($1::text[], $2::text[], $3::timestamptz[], $5::float8[],
                    $6::timestamptz[], $8::text[], $9::text[])
             AS u(job, schedule, next_run, grace, due, tags, spec)
        ON CONFLICT (job) DO UPDATE
        SET schedule = EXCLUDED.schedule, next_run = EXCLUDED.next_run,
            updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by,
            grace = {grace}, grace_until = {until}, due = EXCLUDED.due,
            tags = EXCLUDED.tags, retired_at = NULL, retired_by = NULL,
            spec = coalesce(EXCLUDED.spec, j.spec)
        WHERE j.schedule IS DISTINCT FROM EXCLUDED.schedule
           OR (EXCLUDED.spec IS NOT NULL AND j.spec IS DISTINCT FROM EXCLUDED.spec)
           OR j.retired_at IS NOT NULL
           OR j.next_run IS DISTINCT FROM EXCLUDED.next_run
           OR j.grace IS DISTINCT FROM {grace}
           OR j.grace_until IS DISTINCT FROM {until}
           OR j.due IS DISTINCT FROM EXCLUDED.due
           OR j.tags IS DISTINCT FROM EXCLUDED.tags"""


def prune_sql(table: LedgerTable) -> str:
    """Delete up to ``$2`` rows whose slot is older than ``$1`` seconds ago.

    Each job's latest run and latest success are kept whatever their age, so a job
    that runs monthly, or has failed for longer than the retention, still shows them
    and catch-up still knows where it stopped. Batched so that it never holds the
    shared lock session for long; the caller prunes again soon when a batch was full.
    """
    return f"""
        WITH doomed AS (
            SELECT r.job, r.slot FROM {table.runs} r
            WHERE r.slot < clock_timestamp() - $1::float8 * interval '1 second'
              AND EXISTS (SELECT 1 FROM {table.runs} n
                          WHERE n.job = r.job AND n.slot > r.slot)
              AND (r.outcome IS DISTINCT FROM 'succeeded'
                   OR EXISTS (SELECT 1 FROM {table.runs} s
                              WHERE s.job = r.job AND s.slot > r.slot
                                AND s.outcome = 'succeeded'))
            LIMIT $2
        ), gone AS (
            DELETE FROM {table.runs} r USING doomed d
            WHERE r.job = d.job AND r.slot = d.slot
            RETURNING 1
        )
        SELECT count(*) FROM gone"""


def heartbeat_sql(table: LedgerTable) -> str:
    """``$1`` holder, ``$2`` group digest, ``$3`` seconds to live, ``$4`` whether the
    session it is sent on is one of the replica's own lock sessions (session mode): upsert
    this member and return the other live members of its group (rows expired long ago are
    deleted).

    In session mode the row also names that session (``session``) and when the server
    started (``server_started``): a replica killed ends its sessions at once, so on the
    same server, a member whose session is gone is a replica gone, without waiting for its
    row to expire (:func:`.crashes.sessions_gone`). NULL otherwise: a pool's connections
    come and go while their replica lives.

    ``since`` is when the member's heartbeats began to come without a gap: a heartbeat that
    finds its own row's last beat (``expires_at`` minus the time to live) more than half the
    time to live ago (the server was away, or the replica stalled) starts it again. The
    crash checks trust a member's view of the others' rows only once it has stood a whole
    time to live (:func:`.crashes.owner_gone`): after an outage every live replica has had
    that long to beat again.

    Its commit does not wait for the disk (``synchronous_commit`` off for this transaction):
    a member row is soft state, rewritten every period, and a flush here would hold the
    lock session, and the claims queued on it, for as long as the disk takes."""
    members = table.members
    return f"""
        WITH me AS (
            INSERT INTO {members} AS m (holder, fleet, expires_at, session, server_started)
            VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 second',
                    CASE WHEN $4::boolean THEN pg_backend_pid() END,
                    CASE WHEN $4::boolean THEN pg_postmaster_start_time() END)
            ON CONFLICT (holder) DO UPDATE
            SET fleet = EXCLUDED.fleet, expires_at = EXCLUDED.expires_at,
                session = EXCLUDED.session, server_started = EXCLUDED.server_started,
                since = CASE WHEN m.expires_at
                                  < clock_timestamp() + $3::float8 / 2 * interval '1 second'
                             THEN clock_timestamp() ELSE m.since END
        ), gone AS (
            DELETE FROM {members} WHERE expires_at < clock_timestamp() - interval '1 hour'
        ), relaxed AS MATERIALIZED (
            SELECT set_config('synchronous_commit', 'off', true)
        )
        SELECT holder FROM {members}, relaxed
        WHERE fleet = $2 AND expires_at > clock_timestamp() AND holder <> $1"""


def leave_sql(table: LedgerTable) -> str:
    """``$1`` holder: this member leaves the fleet (its row is deleted, and its job
    definitions with it: see :mod:`.definitions`)."""
    return f"""
        WITH defined AS (DELETE FROM {table.definitions} WHERE holder = $1::text)
        DELETE FROM {table.members} WHERE holder = $1::text"""


def holders_sql(table: LedgerTable) -> str:
    """``$1`` key, ``$2`` job: sessions holding the key that run none of the job's slots here:
    their backend pid, role and address as the server knows them, and the
    ``application_name`` they chose (a claim of the holder's, not proof)."""
    return f"""
        SELECT a.pid, coalesce(a.application_name, '') AS app, host(a.client_addr) AS addr,
               coalesce(a.usename::text, '') AS role
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND ((l.classid::int8 << 32) | l.objid::int8) = $1::int8
          AND a.pid <> pg_backend_pid()
          AND NOT EXISTS (SELECT 1 FROM {table.runs} r
                          WHERE r.job = $2 AND r.session = l.pid AND r.finished_at IS NULL)
          AND NOT EXISTS (SELECT 1 FROM {table.leases} x
                          WHERE x.job = $2 AND x.expires_at > clock_timestamp())"""


def read_secret_sql(table: LedgerTable) -> str:
    """``$1`` name: the value of the fleet's secret *name* (no row: none made yet)."""
    return f"SELECT value FROM {table.secrets} WHERE name = $1"


def make_secret_sql(table: LedgerTable) -> str:
    """``$1`` name, ``$2`` value: make the fleet's secret *name*, unless a process made it
    first (its value is kept: read it again, :func:`read_secret_sql`)."""
    return (
        f"INSERT INTO {table.secrets} (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
    )
