"""The batched statements: many runs' claims, or many runs' ends, in one round trip.

A lock session sends the claims of every job due at the same instant in one statement, and
the outcomes and unlocks of every run that ended meanwhile in another (``_locker/batch.py``).
Each takes arrays (``unnest ... WITH ORDINALITY``) and answers one row per element, tagged
with its 1-based position *i*, so that each caller gets its own answer. Every per-row side
effect (a try-lock, an unlock) sits in a ``MATERIALIZED`` CTE or in the final projection,
where PostgreSQL evaluates it exactly once per row.
"""

from __future__ import annotations

from .runs import CLAIMED_START, real_start, slot_in_range, told_columns
from .tables import LedgerTable

__all__ = (
    "TRY_LOCK_MANY_SQL",
    "TRY_LOCK_ON_SQL",
    "TRY_LOCK_SQL",
    "UNLOCK_MANY_SQL",
    "UNLOCK_SQL",
    "claim_inputs",
    "claim_many_sql",
    "end_ctes",
    "finish_many_sql",
    "undo_lost_sql",
)

# The two session advisory lock statements, in the form every part of the backend uses:
# pg_try_advisory_lock, never the blocking form (losers skip at once, they do not queue).
# The run ledger combines them with its claims (below); the lock-only locker, standalone
# runs and the election send them as they are.
TRY_LOCK_SQL = "SELECT pg_try_advisory_lock($1::bigint)"
"""``$1`` key: take the session advisory lock if free; answers whether it was taken."""
TRY_LOCK_ON_SQL = """
    SELECT CASE WHEN pg_backend_pid() = $2::integer THEN pg_try_advisory_lock($1::bigint) END"""
"""The try-lock, taken only on the backend the connection announced (``$2``): NULL, and no
lock taken, when a pooler or proxy handed the statement to another one (:class:`cronlock.
PoolerDetected`). It costs no round trip of its own. ``$1`` key."""
UNLOCK_SQL = "SELECT pg_advisory_unlock($1::bigint)"
"""``$1`` key: give the session advisory lock back; answers whether it was held."""

TRY_LOCK_MANY_SQL = """
    SELECT u.i, pg_try_advisory_lock(u.key) AS got
    FROM unnest($1::bigint[]) WITH ORDINALITY AS u(key, i)"""
"""Lock-only mode: ``$1`` keys; answers (i, got)."""

UNLOCK_MANY_SQL = """
    SELECT u.i, pg_advisory_unlock(u.key) AS released
    FROM unnest($1::bigint[]) WITH ORDINALITY AS u(key, i)"""
"""Lock-only mode: ``$1`` keys; answers (i, released)."""


def claim_many_sql(table: LedgerTable) -> str:
    """Lock and claim many (job, slot) pairs in one statement (session mode).

    Row by row: the slot already in the ledger (*ran*) or the job paused skips the lock; a
    lock granted for a slot another replica claimed meanwhile is given back in the same
    statement (the ``ON CONFLICT`` is what makes the claim unique; the pre-check only saves
    the lock churn, and a row another transaction is deleting does not count, see
    :func:`claim_inputs`). The claim records this session's backend pid (``session``): that is
    how a crashed run is told from one in progress (``_locker/crashes.py``).

    Arrays ``$1`` keys, ``$2`` jobs, ``$3`` slots; ``$4`` host, ``$5`` pid, ``$6`` this
    locker's holder (its members row tells whether the run's owner is alive). Answers
    (i, ran, paused, got, started_at, undone) per element (*paused*: the job is paused
    fleet-wide and the slot is not its triggered one, see :mod:`.control`; no lock is
    tried then), plus, for a refused one, the job's
    latest *finished* run at or before that slot (``p_*`` columns, NULL when there is
    none): the fleet's history a losing replica learns without reading it again. That
    look-up is one backward step on the primary key, and runs only for refused rows (its
    gate refers to the outer row alone, so the planner skips the scan for granted ones).
    Every look-up is a ``LATERAL ... LIMIT 1``: a probe of the primary key per row, never
    the hashed sequential scan of the whole ledger the planner may pick for an ``EXISTS``
    over a few hundred rows.

    A granted claim also answers the holder it took the job over from, when that one is
    gone (``gone_*`` columns, as :func:`.leases.lease_claim_many_sql` answers them; NULL
    otherwise): the job's latest run before this slot (the statement's snapshot) is another
    locker's and did not end (unfinished, ``crashed`` or ``lock_lost``), though the job's
    lock is free: its lock session ended mid-run (killed, frozen and ended by the crash
    check, cut off), and every slot between was refused to the others as ``locked`` while
    it held the job. *gone_slot* is that run's slot, or the last slot a fate was recorded
    for since (``<table>_slots``: those the holder told itself, as overlap skips, before it
    went); *gone_expired* this statement's time (when its lock ended is not recorded).
    """
    runs = table.runs
    return f"""
        WITH u AS MATERIALIZED ({claim_inputs(table)}
        ), l AS MATERIALIZED (
            SELECT u.i, u.key, u.job, u.slot, u.ran, u.paused, u.manual,
                   CASE WHEN u.ran OR u.paused THEN false
                        ELSE pg_try_advisory_lock(u.key) END AS got
            FROM u
        ), ins AS (
            INSERT INTO {runs} (job, slot, host, pid, session, started_at, manual, holder)
            SELECT l.job, l.slot, $4::text, $5::integer, pg_backend_pid(), {CLAIMED_START},
                   l.manual, $6::text
            FROM l WHERE l.got
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING job, slot, started_at
        ), c AS MATERIALIZED (
            SELECT l.i, l.key, l.job, l.slot, l.ran, l.paused, l.got, ins.started_at
            FROM l LEFT JOIN ins ON ins.job = l.job AND ins.slot = l.slot
        )
        SELECT c.i, c.ran, c.paused, c.got, c.started_at,
               CASE WHEN c.got AND c.started_at IS NULL
                    THEN pg_advisory_unlock(c.key) END AS undone,
               g.slot AS gone_slot, g.holder AS gone_holder,
               g.lapsed AS gone_expired, g.slot AS gone_since,
               {told_columns(runs)}
        LEFT JOIN LATERAL ({_gone_holder(table)}) g ON true"""


def _gone_holder(table: LedgerTable) -> str:
    """The look-up behind a session-mode claim's ``gone_*`` columns (see
    :func:`claim_many_sql`): for a granted row ``c``, one backward probe of the primary key
    for the job's latest run before its slot, and, only when that run's holder is gone, a
    range probe of the slot records after it."""
    told = f"""(SELECT max(least(s.last_slot, c.slot)) FROM {table.slots} s
                WHERE s.job = c.job AND s.slot > p.slot AND s.slot < c.slot)"""
    return f"""
            SELECT greatest(p.slot, coalesce({told}, p.slot)) AS slot, p.holder,
                   clock_timestamp() AS lapsed
            FROM (SELECT r.slot, r.holder, r.finished_at, r.outcome FROM {table.runs} r
                  WHERE c.started_at IS NOT NULL AND r.job = c.job AND r.slot < c.slot
                  ORDER BY r.slot DESC LIMIT 1) p
            WHERE p.holder IS NOT NULL AND p.holder <> $6::text
              AND {slot_in_range("p.slot")}
              AND (p.finished_at IS NULL OR p.outcome IN ('crashed', 'lock_lost'))"""


def undo_lost_sql(table: LedgerTable) -> str:
    """Give back this process's claims whose answer was lost (session mode).

    A claim sent on a session that died before its answer came may have committed: its row
    then stands, unfinished, for a run that never began, and the slot's next claim would be
    told ``"already_ran"``. Arrays ``$1`` jobs, ``$2`` slots (the claims in doubt); ``$3``
    host, ``$4`` pid. Deletes each such row that is this process's first attempt, unfinished
    and claimed on another session than this one (the lost one), so that the slot is claimed
    again. Answers the count deleted. The lost session's lock went with it (ended by
    :data:`.sessions.END_LOST_BACKEND_SQL` if the server did not notice yet).
    """
    return f"""
        WITH gone AS (
            DELETE FROM {table.runs} r
            USING unnest($1::text[], $2::timestamptz[]) AS u(job, slot)
            WHERE r.job = u.job AND r.slot = u.slot AND r.finished_at IS NULL
              AND r.attempt = 1 AND r.host = $3::text AND r.pid = $4::integer
              AND r.session IS DISTINCT FROM pg_backend_pid()
            RETURNING 1
        )
        SELECT count(*) AS undone FROM gone"""


def claim_inputs(table: LedgerTable) -> str:
    """The body of the claims' first CTE, ``u``, the same in both modes: the arrays ``$1``
    keys, ``$2`` jobs, ``$3`` slots, each row with whether its slot is in the ledger
    already (*ran*), whether its job is paused fleet-wide (the triggered slot exempt), and
    whether the slot is the job's trigger slot (*manual*: the claim marks its row so), each
    a primary-key probe (``LATERAL ... LIMIT 1``).

    A row that another transaction is changing (``xmax`` set: the undo of a cancelled claim
    deleting it, or a finish still in flight) is not taken as *ran*: this statement's
    snapshot still shows the row even when its delete is about to commit, and answering
    ``"already_ran"`` from it would lose a slot nobody ran. Such a row takes the full path
    instead (the exclusion, then the ``ON CONFLICT`` insert, which waits for that
    transaction and sees its outcome). Rows not being changed, the ordinary case, still
    skip the exclusion."""
    runs = table.runs
    return f"""
            SELECT u.i, u.key, u.job, u.slot, seen.job IS NOT NULL AS ran,
                   coalesce(pz.paused, false) AS paused, coalesce(pz.manual, false) AS manual
            FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) WITH ORDINALITY
                 AS u(key, job, slot, i)
            LEFT JOIN LATERAL (
                SELECT r.job FROM {runs} r
                WHERE r.job = u.job AND r.slot = u.slot AND r.xmax = '0'::xid LIMIT 1
            ) seen ON true
            LEFT JOIN LATERAL (
                SELECT pc.paused_at IS NOT NULL AND pc.trigger_slot IS DISTINCT FROM u.slot
                       AS paused,
                       pc.trigger_slot IS NOT DISTINCT FROM u.slot AS manual
                FROM {table.control} pc WHERE pc.job = u.job LIMIT 1
            ) pz ON true"""


def finish_many_sql(table: LedgerTable) -> str:
    """Record outcomes (or undo claims) and unlock, for many runs in one statement.

    Arrays ``$1`` jobs, ``$2`` slots, ``$3`` outcomes (NULL: none recorded), ``$4``
    errors, ``$5`` keys, ``$6`` undo flags, ``$9`` the instants the runs' bodies began
    (:func:`real_start`); ``$7`` host, ``$8`` pid. A row to *undo* is
    a claim whose caller was cancelled before its run began: deleted, so that another
    replica may still run the slot, or, for the rerun of a crashed run (attempt 2),
    recorded ``"cancelled"``: the row also stands for the first attempt, and no replica may
    take the slot over again. Answers (i, released).

    The rows are changed before any lock is given back (the final projection reads
    ``written``, so the ``DELETE`` and ``UPDATE`` run first), and the claim's pre-check does
    not trust a row being changed (:func:`claim_inputs`): the unlocks take effect at once
    and the changes at commit, a moment later, and a claim in between that takes the lock
    has its insert wait for this commit, then runs the slot an undo gave back (or finds the
    slot claimed, for an outcome). No claim can take a deleted-but-uncommitted claim for a
    slot that ran. The commit is as durable as the session's (``synchronous_commit`` is
    never lowered here): another replica acts on an outcome or an undo (it catches up,
    retries or reruns by it), so one acknowledged and then lost at a crash or failover would
    have the slot run again. A batch of ends is one transaction, so one WAL flush (and, with
    synchronous replication, one standby acknowledgement) covers all of its rows.
    Rows are found by a primary-key probe each (``LATERAL ... LIMIT 1``), then
    changed by their ``ctid``: a join on (job, slot) let the planner scan every unfinished
    row once per row of the batch, seconds for a burst of thousands.
    """
    runs = table.runs
    return f"""
        WITH u AS MATERIALIZED (
            SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[],
                                 $5::bigint[], $6::boolean[], $9::timestamptz[]) WITH ORDINALITY
                 AS u(job, slot, outcome, error, key, undo, started, i)
        ), {end_ctes(runs)}
        ), written AS MATERIALIZED (
            SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM upd) AS n
        )
        SELECT u.i, pg_advisory_unlock(u.key) AS released
        FROM u, written"""


def end_ctes(runs: str) -> str:
    """The CTEs of an end of many runs that touch the runs table (``t``, ``del``, ``upd``),
    the same in both modes: each run's row found by a primary-key probe, deleted for an
    undo of a first attempt, else given its outcome. They read the CTE ``u`` (the arrays of
    :func:`finish_many_sql`) and ``$7`` host, ``$8`` pid; ``del`` and ``upd`` return the job
    of each row they changed. An outcome also records when the run's body really began."""
    return f"""t AS MATERIALIZED (
            SELECT u.outcome, u.error, u.undo, u.started, r.rid, r.host, r.pid, r.attempt
            FROM u JOIN LATERAL (
                SELECT r.ctid AS rid, r.host, r.pid, r.attempt FROM {runs} r
                WHERE r.job = u.job AND r.slot = u.slot AND r.finished_at IS NULL LIMIT 1
            ) r ON true
        ), del AS (
            DELETE FROM {runs} r USING t
            WHERE r.ctid = t.rid AND t.undo AND t.host = $7::text AND t.pid = $8::integer
              AND t.attempt = 1
            RETURNING r.job
        ), upd AS (
            UPDATE {runs} r
            SET finished_at = clock_timestamp(),
                started_at = {real_start("r.started_at", "t.started", "clock_timestamp()")},
                outcome = CASE WHEN t.undo THEN 'cancelled' ELSE t.outcome END,
                error = CASE WHEN t.undo THEN 'cancelled before the rerun began'
                             ELSE t.error END
            FROM t
            WHERE r.ctid = t.rid
              AND (NOT t.undo OR (t.host = $7::text AND t.pid = $8::integer
                                  AND t.attempt > 1))
            RETURNING r.job"""
