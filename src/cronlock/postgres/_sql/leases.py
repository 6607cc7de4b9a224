"""Lease mode's statements: exclusion as rows of the ledger's leases table, not sessions.

In lease mode no statement relies on the session it runs on: each is one transaction, so it
works through a transaction pooler. "Someone runs job J" is J's row in the leases table
whose ``expires_at`` (the **server's** time) is in the future; the holder renews it while
the run goes on (``_modes/lease.py``) and releases it, with the run's outcome, in the finish
statement. A run whose lease expired without an outcome crashed.

Why a row per job rather than a column of each run: a claim must see the *latest* lease of
the job, and in READ COMMITTED a statement's snapshot does not see a row that another
transaction inserted after the statement began. An ``ON CONFLICT (job) DO UPDATE ... WHERE``
on one row per job is evaluated against the latest committed version of that row (the
conflicting row is locked first), so two replicas can never both take a job's lease, even
for different slots. A ``pg_try_advisory_xact_lock`` (released at commit, so it works through
any pooler) makes a racing claimant of the same slot give up at once instead of waiting for
the other's commit; it also makes a claim wait for no session lock of the same key.

That lock's key is the claim's own (``_claim_key``): the job's key mixed with the slot
(and, for a takeover, the attempt), never the job's key alone. Advisory keys are
database-wide and ``pg_locks`` shows every held key to every role: a session of any role
that read a job's key there could take it and hold every later claim of the job off. A
claim's key is held only for its statement and never used again (the next slot's differs),
so a key read from ``pg_locks`` holds nothing off; exclusion itself is the leases row, which
only roles with the ledger's grants can write or lock.

Row locks on leases are always taken in job order (the claims' ``ORDER BY``, the ``FOR
UPDATE`` before renewing or releasing), so statements of different replicas cannot deadlock.
"""

from __future__ import annotations

from .claims import claim_inputs, end_ctes
from .crashes import KEPT_ATTEMPTS, TAKEN_OVER, last_sign_of_life, owner_gone
from .runs import CLAIMED_START, R_RUN, late_finish_sql, sane, told_columns
from .tables import LedgerTable

__all__ = (
    "lease_claim_many_sql",
    "lease_crashed_sql",
    "lease_finish_many_sql",
    "lease_holders_sql",
    "lease_late_finish_sql",
    "lease_recover_sql",
    "lease_undo_lost_sql",
    "renew_sql",
)

_EXPIRES = "clock_timestamp() + $7::float8 * interval '1 second'"


def _claim_key(key: str, slot: str, attempt: str = "1") -> str:
    """SQL: the advisory key of one claim, the job's *key* (a bigint expression) mixed with
    its *slot* (a timestamptz expression, as microseconds since the epoch, so the session's
    TimeZone does not matter) and the *attempt* claimed (a takeover's differs from the
    first claim's). Racing claimants of one slot and attempt compute the same key; a key
    seen in ``pg_locks`` is never a later claim's."""
    return (
        f"hashtextextended((extract(epoch FROM {slot}) * 1000000)::int8::text || ':' || "
        f"({attempt})::text, {key})"
    )


def lease_undo_lost_sql(table: LedgerTable) -> str:
    """Give back this process's claims whose answer was lost (lease mode): as
    :func:`.claims.undo_lost_sql`, and the lease of each is released for no slot, as an
    undone claim's (:func:`lease_finish_many_sql`). Arrays ``$1`` jobs, ``$2`` slots; ``$3``
    host, ``$4`` pid, ``$5`` holder. Answers the count deleted."""
    runs, leases = table.runs, table.leases
    return f"""
        WITH gone AS (
            DELETE FROM {runs} r
            USING unnest($1::text[], $2::timestamptz[]) AS u(job, slot)
            WHERE r.job = u.job AND r.slot = u.slot AND r.finished_at IS NULL
              AND r.attempt = 1 AND r.host = $3::text AND r.pid = $4::integer
            RETURNING r.job, r.slot
        ), freed AS (
            UPDATE {leases} x SET expires_at = '-infinity', slot = '-infinity'
            FROM gone WHERE x.job = gone.job AND x.slot = gone.slot AND x.holder = $5::text
            RETURNING 1
        )
        SELECT count(*) AS undone FROM gone"""


def lease_claim_many_sql(table: LedgerTable) -> str:
    """Take the lease and claim many (job, slot) pairs in one statement.

    Arrays ``$1`` keys, ``$2`` jobs, ``$3`` slots; ``$4`` host, ``$5`` pid, ``$6`` holder,
    ``$7`` lease seconds. Answers what :func:`.claims.claim_many_sql` answers (*got*: the
    lease was taken), plus *stray*: the lease was taken but the slot had been claimed
    meanwhile (seen only in the latest data, not in this statement's snapshot), so the caller
    gives that lease back; and for a claim granted by taking over a lease that another
    holder let expire unreleased (it was killed, frozen or cut off mid-run), that lease's
    slot, holder and expiry (*gone_slot*, *gone_holder*, *gone_expired*, read from the
    statement's snapshot: no slot of the job between that one and this claim's ran, each was
    refused while the gone holder's lease stood), and its last renewal as far as a lease of
    this length tells (*gone_since*). A job's lease is taken only while no unexpired lease
    of the job exists, or the live one is this holder's (a holder claims a job only with no
    run of it in flight: a lease of its own is one whose release was lost, to a cut
    connection or a failover, and must not hold its own next slot off), and the latest one
    was not for this very slot (then the slot ran already; the lease of an undone claim is
    released for no slot, see :func:`lease_finish_many_sql`).
    """
    runs, leases = table.runs, table.leases
    return f"""
        WITH u AS MATERIALIZED ({claim_inputs(table)}
        ), l AS MATERIALIZED (
            SELECT u.i, u.job, u.slot, u.ran, u.paused, u.manual,
                   CASE WHEN u.ran OR u.paused THEN false
                        ELSE pg_try_advisory_xact_lock({_claim_key("u.key", "u.slot")})
                   END AS free
            FROM u
        ), lease AS (
            INSERT INTO {leases} AS x (job, slot, holder, expires_at, attempt)
            SELECT l.job, l.slot, $6::text, {_EXPIRES}, 1
            FROM l WHERE l.free ORDER BY l.job
            ON CONFLICT (job) DO UPDATE
            SET slot = EXCLUDED.slot, holder = EXCLUDED.holder,
                expires_at = EXCLUDED.expires_at, attempt = 1
            WHERE (x.expires_at <= clock_timestamp() OR x.holder = EXCLUDED.holder)
              AND x.slot <> EXCLUDED.slot
            RETURNING x.job
        ), ins AS (
            INSERT INTO {runs} (job, slot, host, pid, session, started_at, manual, holder)
            SELECT l.job, l.slot, $4::text, $5::integer, NULL, {CLAIMED_START},
                   l.manual, $6::text
            FROM l JOIN lease ON lease.job = l.job
            ORDER BY l.job
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING job, slot, started_at
        ), c AS MATERIALIZED (
            SELECT l.i, l.job, l.slot, l.ran, l.paused, lease.job IS NOT NULL AS got,
                   ins.started_at
            FROM l LEFT JOIN lease ON lease.job = l.job
            LEFT JOIN ins ON ins.job = l.job AND ins.slot = l.slot
        )
        SELECT c.i, c.ran, c.paused, c.got, c.started_at,
               c.got AND c.started_at IS NULL AS stray,
               g.slot AS gone_slot, g.holder AS gone_holder, g.expires_at AS gone_expired,
               g.expires_at - $7::float8 * interval '1 second' AS gone_since,
               {told_columns(runs)}
        LEFT JOIN LATERAL (
            SELECT w.slot, w.holder, w.expires_at FROM {leases} w
            WHERE c.started_at IS NOT NULL AND w.job = c.job
              AND w.holder IS DISTINCT FROM $6::text AND w.expires_at > '-infinity'
              AND w.slot < c.slot
        ) g ON true"""


def lease_finish_many_sql(table: LedgerTable) -> str:
    """Record outcomes (or undo claims) and release the leases, for many runs at once.

    The parameters of :func:`.claims.finish_many_sql` (``$5`` keys are unused here) plus
    ``$10`` holder. Answers (i, released): *released* false when the lease was no longer
    this holder's (it expired and another replica took it over). The leases are locked in
    job order first. Like the session form, it commits at the session's durability: a
    release acknowledged and then lost at a crash would leave the job blocked, on the
    server that takes over, until the lease expires (and the outcome missing).

    The lease of a claim undone (its row deleted) is released for no slot (``-infinity``),
    not for the slot it was taken for: a claim only takes a lease whose latest slot is not
    its own (that slot ran), and the undo gives the slot back. A claim that comes while the
    undo commits waits for the lease row's lock, then takes the lease, and its insert of
    the run finds the undone row gone: it runs the slot.
    """
    runs, leases = table.runs, table.leases
    return f"""
        WITH u AS MATERIALIZED (
            SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[],
                                 $5::bigint[], $6::boolean[], $9::timestamptz[]) WITH ORDINALITY
                 AS u(job, slot, outcome, error, key, undo, started, i)
        ), lk AS MATERIALIZED (
            SELECT x.job, x.slot FROM {leases} x JOIN u ON x.job = u.job AND x.slot = u.slot
            WHERE x.holder = $10::text
            ORDER BY x.job FOR UPDATE OF x
        ), {end_ctes(runs)}
        ), rel AS (
            UPDATE {leases} x SET expires_at = '-infinity',
                slot = CASE WHEN x.job IN (SELECT job FROM del) THEN '-infinity' ELSE x.slot END
            FROM lk WHERE x.job = lk.job AND x.holder = $10::text
            RETURNING x.job
        )
        SELECT u.i, EXISTS (SELECT 1 FROM lk WHERE lk.job = u.job) AS released
        FROM u"""


def renew_sql(table: LedgerTable) -> str:
    """Renew this holder's unexpired leases: arrays ``$1`` jobs, ``$2`` slots; ``$3`` holder,
    ``$4`` lease seconds. Answers the jobs renewed; a lease left out has expired (another
    replica may have taken it over, or marked its run crashed), so its run must end."""
    leases = table.leases
    return f"""
        WITH lk AS MATERIALIZED (
            SELECT x.job FROM {leases} x
            JOIN unnest($1::text[], $2::timestamptz[]) AS u(job, slot)
              ON x.job = u.job AND x.slot = u.slot
            WHERE x.holder = $3::text AND x.expires_at > clock_timestamp()
            ORDER BY x.job FOR UPDATE OF x
        )
        UPDATE {leases} x
        SET expires_at = clock_timestamp() + $4::float8 * interval '1 second'
        FROM lk WHERE x.job = lk.job AND x.holder = $3::text
        RETURNING x.job"""


def lease_recover_sql(table: LedgerTable) -> str:
    """Take the lease and take over a crashed run's slot: the claim of its rerun.

    ``$1`` key, ``$2`` job, ``$3`` slot, ``$4`` host, ``$5`` pid, ``$6`` holder, ``$7``
    lease seconds, ``$8`` the attempt to claim. Answers as ``_locker/crashes.recover_sql``
    does, plus *stray* (see :func:`lease_claim_many_sql`). The row is taken over on the
    same terms (``_locker/crashes.TAKEN_OVER``): a crashed run is rerun at most once
    fleet-wide, each attempt of a retried slot is claimed once; the attempt taken over is
    kept in the row's ``attempts`` (``.crashes.KEPT_ATTEMPTS``).
    """
    runs, leases = table.runs, table.leases
    return f"""
        WITH p AS MATERIALIZED (
            SELECT EXISTS (SELECT 1 FROM {table.control}
                           WHERE job = $2 AND paused_at IS NOT NULL) AS paused
        ), l AS MATERIALIZED (
            SELECT p.paused,
                   CASE WHEN p.paused THEN false
                        ELSE pg_try_advisory_xact_lock({
        _claim_key("$1::bigint", "$3::timestamptz", "$8::smallint")
    }) END AS free
            FROM p
        ), lease AS (
            INSERT INTO {leases} AS x (job, slot, holder, expires_at, attempt)
            SELECT $2::text, $3::timestamptz, $6::text, {_EXPIRES}, $8::smallint
            FROM l WHERE l.free
            ON CONFLICT (job) DO UPDATE
            SET slot = EXCLUDED.slot, holder = EXCLUDED.holder,
                expires_at = EXCLUDED.expires_at, attempt = EXCLUDED.attempt
            WHERE x.expires_at <= clock_timestamp()
            RETURNING x.job
        ), up AS (
            UPDATE {runs} r
            SET host = $4::text, pid = $5::integer, session = NULL, holder = $6::text,
                attempts = {KEPT_ATTEMPTS},
                started_at = clock_timestamp(), finished_at = NULL, outcome = NULL,
                error = NULL, attempt = $8::smallint, retry_at = NULL
            WHERE r.job = $2 AND r.slot = $3 AND {TAKEN_OVER.format(attempt="$8::smallint")}
              AND EXISTS (SELECT 1 FROM lease)
            RETURNING r.started_at
        ), c AS MATERIALIZED (
            SELECT l.paused, EXISTS (SELECT 1 FROM lease) AS got,
                   (SELECT started_at FROM up) AS started_at
            FROM l
        )
        SELECT false AS ran, c.paused, c.got, c.started_at,
               c.got AND c.started_at IS NULL AS stray
        FROM c"""


def lease_crashed_sql(table: LedgerTable) -> str:
    """Mark ``crashed`` the unfinished lease-mode runs whose lease is gone, and their owner
    with it; return them.

    ``$3`` holder: a run whose lease is still this holder's is left to it (it writes the
    real outcome itself). ``$4`` the members' time to live in seconds: a run whose owner is
    alive (its members row, :func:`.crashes.owner_gone`) is not crashed, even once its
    lease expired (a release lost at a failover; the owner writes the outcome itself). A
    lease-mode run has no session (``session`` NULL, which the session form leaves alone).
    Its ``finished_at`` is its owner's last sign of life (``.crashes.last_sign_of_life``).
    The time is the statement's start (``now()``), the instant of its snapshot, so a
    renewal committed after the snapshot cannot be missed. ``$1``, ``$2`` (host, pid) are
    accepted for the same call as the session form.
    """
    runs, leases = table.runs, table.leases
    return f"""
        UPDATE {runs} AS r
        SET outcome = 'crashed', finished_at = {last_sign_of_life(table, "$4::float8")},
            error = 'its replica (' || r.host || ':' || r.pid || ') died mid-run: '
                    || CASE WHEN r.holder IS NULL THEN 'its lease expired'
                            ELSE 'its lease expired and its membership is gone' END
        WHERE r.finished_at IS NULL AND r.session IS NULL
          AND $1::text IS NOT NULL AND $2::integer IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM {leases} x
                          WHERE x.job = r.job AND x.slot = r.slot
                            AND (x.expires_at > now() OR x.holder = $3::text))
          AND {owner_gone(table, "$3::text", "$4::float8")}
        RETURNING r.job, {R_RUN}"""


def lease_late_finish_sql(table: LedgerTable) -> str:
    """:func:`.runs.late_finish_sql` (same ``$1``-``$9``, same answers), and the release
    of those runs' leases while still this holder's (``$10``)."""
    return f"""
        WITH done AS (
            {late_finish_sql(table).strip()}
        ), rel AS (
            UPDATE {table.leases} x SET expires_at = '-infinity'
            FROM unnest($1::text[], $2::timestamptz[]) AS u(job, slot)
            WHERE x.job = u.job AND x.slot = u.slot AND x.holder = $10::text
        )
        SELECT job, slot, unmarked FROM done"""


def lease_holders_sql(table: LedgerTable) -> str:
    """Every unexpired lease right now (job, holder, slot, host, pid): as many as runs in
    progress in lease mode, however many jobs."""
    return f"""
        SELECT x.job, x.holder, {sane("x.slot", "slot")}, r.host, r.pid FROM {table.leases} x
        LEFT JOIN {table.runs} r ON r.job = x.job AND r.slot = x.slot
        WHERE x.expires_at > clock_timestamp()"""
