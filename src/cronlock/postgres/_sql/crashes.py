"""The statements of crashed runs in session mode: find and mark them, take their rows over.

See :mod:`cronlock.postgres._locker.crashes` for what a crash is and who reruns it; lease
mode's forms are in :mod:`.leases`.
"""

from __future__ import annotations

from .runs import R_RUN
from .tables import LedgerTable

__all__ = (
    "KEPT_ATTEMPTS",
    "TAKEN_OVER",
    "crashed_sql",
    "last_sign_of_life",
    "owner_gone",
    "recover_sql",
    "retries_due_sql",
    "retries_pending_sql",
    "retry_due_sql",
    "sessions_gone",
)


def owner_gone(table: LedgerTable, holder: str, ttl: str) -> str:
    """The condition, on a run ``r``, that its owner is gone: both modes' crash checks add
    it to their own (session gone, lease expired). *holder* and *ttl* are the ``$n`` of the
    checking locker's holder and of the members' time to live in seconds
    (:data:`.upkeep.MEMBER_TTL`).

    A run claimed by an older cronlock (no ``holder``) keeps the old rule: its own condition
    alone. Otherwise its owner (the locker that claimed it, ``r.holder``) is gone when

    - its members row is expired or absent, and the claim is older than the time to live
      (a replica's first heartbeat comes some seconds after its start: a run claimed
      meanwhile has no row yet, and its claim is itself a sign of life);
    - and the checking locker's own row has stood, without a gap, for the time to live
      (``since``, see :func:`.upkeep.heartbeat_sql`): after an outage or a failover, every
      replica that came back with it has had that long to beat again, so a row expired
      while the server was away is not taken for a dead replica.

    A failover leaves every run's session pid unknown to the new server; a live replica
    keeps beating there, so its runs are never marked, and it writes their outcomes itself.
    """
    members = table.members
    return f"""(r.holder IS NULL OR (
                r.holder <> {holder}
                AND r.started_at < now() - {ttl} * interval '1 second'
                AND NOT EXISTS (SELECT 1 FROM {members} m
                                WHERE m.holder = r.holder AND m.expires_at > now())
                AND EXISTS (SELECT 1 FROM {members} me
                            WHERE me.holder = {holder} AND me.expires_at > now()
                              AND me.since <= now() - {ttl} * interval '1 second')))"""


def sessions_gone(table: LedgerTable, holder: str) -> str:
    """The condition, on a run ``r`` whose own session is gone, that its owner's session is
    gone too, on an unchanged server: session mode's quick sign of a killed replica.

    A session-mode member's row names the lock session it beats on and when the server it
    beat on started (:func:`.upkeep.heartbeat_sql`). A replica that is killed ends every
    session it has at once: its run's lock session and that one. So where both are gone
    from ``pg_stat_activity`` and the server is the one the row was written on (same
    ``pg_postmaster_start_time()``: not restarted, not a standby promoted, not a snapshot
    restored), the owner is gone, without waiting for its row to expire. Its run has lost
    its lock in any case (its lock session is gone): a live replica's outcome, written
    late, replaces ``crashed`` (:func:`crashed_sql`). A recycled pid only delays this to
    :func:`owner_gone`'s rule; after a server change, that rule alone stands. *holder* is
    the ``$n`` of the checking locker's holder."""
    return f"""(r.holder IS NOT NULL AND r.holder <> {holder} AND EXISTS (
                SELECT 1 FROM {table.members} m
                WHERE m.holder = r.holder AND m.session IS NOT NULL
                  AND m.server_started = pg_postmaster_start_time()
                  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = m.session)))"""


def last_sign_of_life(table: LedgerTable, ttl: str) -> str:
    """When a crashed run ``r`` ended, as well as the ledger knows: its owner's last
    heartbeat (its members row's expiry less the time to live *ttl*, a ``$n``), not the
    check that noticed it; never before the run's claim nor after now. Without a members
    row (an older cronlock's claim, or a row deleted an hour after it expired): now."""
    beat = f"""(SELECT m.expires_at - {ttl} * interval '1 second' FROM {table.members} m
                WHERE m.holder = r.holder)"""
    return f"greatest(r.started_at, least(clock_timestamp(), coalesce({beat}, clock_timestamp())))"


def crashed_sql(table: LedgerTable) -> str:
    """Mark unfinished runs whose claiming session is gone, and their owner with it
    (:func:`owner_gone`, or :func:`sessions_gone`: within a check of a kill), ``crashed``;
    return them.

    ``$1`` host, ``$2`` pid: this process's own runs are left alone, since it writes their
    real outcome itself once a session is back (a run whose session died under a live
    replica ends ``lock_lost``). ``$3`` this locker's holder, ``$4`` the members' time to
    live in seconds: a run whose owner is alive (its members row, :func:`owner_gone`) is
    not crashed, however unknown its session pid is to this server (a failover). Concurrent
    checks by several replicas mark each row once: the second one finds it finished.

    Its ``finished_at`` is its last sign of life (:func:`last_sign_of_life`), so that its
    duration is the run's, not the detection's delay.

    A run whose owner is gone but whose session is still there is a frozen holder's (a
    process stopped, or its host frozen: the kernel keeps its TCP session alive, so the
    server keeps its locks, for good): the statement ends that session
    (``pg_terminate_backend``, only a backend of this role) so that its locks are released
    and its jobs run again, and the next check, its session gone, marks the run crashed.
    The membership heartbeat tells a frozen holder from a slow run: a slow run's replica
    keeps beating. So a frozen holder's runs end about ``MEMBER_TTL`` plus two checks after
    its last heartbeat. A holder that wakes finds its lock session gone: its runs end
    ``lock_lost``.
    """
    gone = owner_gone(table, "$3::text", "$4::float8")
    killed = sessions_gone(table, "$3::text")
    return f"""
        WITH frozen AS MATERIALIZED (
            SELECT pg_terminate_backend(a.pid) AS ended
            FROM {table.runs} r JOIN pg_stat_activity a ON a.pid = r.session
            WHERE r.finished_at IS NULL AND r.holder IS NOT NULL
              AND NOT (r.host = $1::text AND r.pid = $2::integer)
              AND a.usename = current_user AND a.pid <> pg_backend_pid()
              AND {gone}
        )
        UPDATE {table.runs} AS r
        SET outcome = 'crashed', finished_at = {last_sign_of_life(table, "$4::float8")},
            error = 'its replica (' || r.host || ':' || r.pid || ') died mid-run: '
                    || CASE WHEN r.holder IS NULL THEN 'lock session gone'
                            WHEN {gone} THEN 'lock session and membership gone'
                            ELSE 'lock session and membership session gone' END
        WHERE r.finished_at IS NULL AND r.session IS NOT NULL
          AND NOT (r.host = $1::text AND r.pid = $2::integer)
          AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.session)
          AND ({gone} OR {killed})
          AND (SELECT count(*) FROM frozen) >= 0
        RETURNING r.job, {R_RUN}"""


TAKEN_OVER = """r.attempt = {attempt} - 1
              AND (r.outcome IN ('failed', 'timed_out')
                   OR (r.outcome IN ('crashed', 'lock_lost') AND r.attempt = 1))"""
"""Which row a takeover claiming attempt *attempt* may take: the attempt before it, failed
or timed out (a retry), or crashed or cut off on its first attempt (a crashed run's rerun)."""


KEPT_ATTEMPTS = """CASE WHEN jsonb_typeof(r.attempts) = 'array' THEN r.attempts
                   ELSE '[]'::jsonb END
              || jsonb_build_array(jsonb_build_object(
                   'attempt', r.attempt, 'started_at', r.started_at,
                   'finished_at', r.finished_at, 'outcome', r.outcome, 'error', r.error,
                   'host', r.host, 'pid', r.pid))"""
"""The ``attempts`` a takeover writes: the row's earlier attempts (a JSON array, oldest
first) with the attempt it takes over (``r``, its values before the takeover) appended,
so that a slot's history keeps every attempt, not only its last (both modes' takeovers;
``.runs.decode_attempts`` reads it back). A value that is not an array, an operator's
say, is started afresh rather than failing the takeover."""


def recover_sql(table: LedgerTable) -> str:
    """Lock and take over a slot's row, in one statement: the claim of a crashed run's rerun
    or of a failed run's retry.

    The same parameters and answers as :func:`.claims.claim_many_sql` (*ran* is always
    false: the row is expected; a job paused fleet-wide is refused as by the claim), and
    ``$6`` the attempt to claim, ``$7`` this locker's holder. Only the row at the attempt
    before it is taken over, and only while it failed or timed out, or was marked
    ``crashed`` (or ``lock_lost``) on its first attempt (:data:`TAKEN_OVER`; this replica as
    owner, started now): a crashed run is rerun at most once fleet-wide, and every attempt
    of a retried slot is claimed once. The attempt taken over is appended to the row's
    ``attempts`` (:data:`KEPT_ATTEMPTS`), and its pending retry, if any, is cleared
    (``retry_at``: the retry is this claim). A lock granted for a row that cannot be taken over
    is given back in the same statement.
    """
    return f"""
        WITH p AS MATERIALIZED (
            SELECT EXISTS (SELECT 1 FROM {table.control}
                           WHERE job = $2 AND paused_at IS NOT NULL) AS paused
        ), l AS MATERIALIZED (
            SELECT p.paused,
                   CASE WHEN p.paused THEN false ELSE pg_try_advisory_lock($1::bigint) END AS got
            FROM p
        ), up AS (
            INSERT INTO {table.runs} AS r (job, slot, host, pid, session, attempt, holder)
            SELECT $2::text, $3::timestamptz, $4::text, $5::integer, pg_backend_pid(),
                   $6::smallint, $7::text
            FROM l WHERE l.got
            ON CONFLICT (job, slot) DO UPDATE
            SET host = EXCLUDED.host, pid = EXCLUDED.pid, session = EXCLUDED.session,
                holder = EXCLUDED.holder, attempts = {KEPT_ATTEMPTS},
                started_at = clock_timestamp(), finished_at = NULL, outcome = NULL,
                error = NULL, attempt = $6::smallint, retry_at = NULL
            WHERE {TAKEN_OVER.format(attempt="$6::smallint")}
            RETURNING r.started_at
        ), c AS MATERIALIZED (
            SELECT l.paused, l.got, (SELECT started_at FROM up) AS started_at FROM l
        )
        SELECT false AS ran, c.paused, c.got, c.started_at,
               CASE WHEN c.got AND c.started_at IS NULL
                    THEN pg_advisory_unlock($1::bigint) END AS undone
        FROM c"""


def retry_due_sql(table: LedgerTable) -> str:
    """Write down that attempt ``$3`` of slot ``$2`` of job ``$1`` is due at ``$4``: the
    retry the replica whose attempt failed will make, in the ledger, so that another replica
    makes it if that one is gone by then (:func:`retries_due_sql`). Only while the row is
    the failed or timed-out attempt before it (a row taken over meanwhile is left alone).
    """
    return f"""
        UPDATE {table.runs} AS r SET retry_at = $4::timestamptz
        WHERE r.job = $1::text AND r.slot = $2::timestamptz
          AND r.attempt = $3::smallint - 1 AND r.outcome IN ('failed', 'timed_out')"""


def retries_pending_sql(table: LedgerTable) -> str:
    """The jobs with a pending retry due ``$1`` seconds ago or more, of any replica: a
    look at the retry index (usually nothing) before :func:`retries_due_sql` is sent the
    names of the few of this replica's jobs among them, not all of its 100,000."""
    return f"""
        SELECT DISTINCT r.job FROM {table.runs} AS r
        WHERE r.retry_at <= now() - $1::float8 * interval '1 second'"""


def retries_due_sql(table: LedgerTable) -> str:
    """Take the pending retries of the jobs ``$1`` (this replica's) that their replica did
    not make: due ``$2`` seconds ago or more (its own retry comes first), the attempt before
    still failed or timed out, and its owner gone (:func:`owner_gone`, with ``$3`` this
    locker's holder and ``$4`` the members' time to live). Each is cleared as it is returned,
    so one replica gets it; the answers are runs (:data:`.runs.R_RUN`), of the attempt that
    failed, whose next attempt the caller may claim by taking the row over
    (:func:`recover_sql`: once fleet-wide, however many replicas try).
    """
    return f"""
        UPDATE {table.runs} AS r SET retry_at = NULL
        WHERE r.retry_at <= now() - $2::float8 * interval '1 second'
          AND r.job = ANY($1::text[])
          AND r.finished_at IS NOT NULL AND r.outcome IN ('failed', 'timed_out')
          AND {owner_gone(table, "$3::text", "$4::float8")}
        RETURNING r.job, {R_RUN}"""
