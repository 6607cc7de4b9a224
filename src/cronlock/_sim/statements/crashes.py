"""Statements of crashed runs and of retries left behind (``cronlock.postgres._sql.crashes``),
in the simulated server: the session-mode crash check, the takeover of a crashed or failed
row (the claim of a rerun or a retry), and the pending retries' writes and reads.

Also here, for the other modules of this folder: :func:`owner_gone` (both modes' crash
checks add it) and :func:`run_answer` (a run's :data:`..runs.RUN_COLUMNS` as a read or a
``RETURNING`` answers them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...postgres._sql import crashes
from ...postgres._sql.runs import RUN_COLUMNS
from ..rows import Row, rows
from .session import status
from .upkeep import in_range, jsonb_value, sane, seconds, timestamp_text

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = ("json_instant", "kept_attempts", "owner_gone", "register", "run_answer", "taken_over")

_RETRIED = ("failed", "timed_out")
_CUT = ("crashed", "lock_lost")


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers."""
    add = statements.add
    add(crashes.crashed_sql(table), _crashed)
    add(crashes.recover_sql(table), _recover)
    add(crashes.retry_due_sql(table), _retry_due)
    add(crashes.retries_pending_sql(table), _retries_pending)
    add(crashes.retries_due_sql(table), _retries_due)


# -- shared with the other modules --------------------------------------------------------------


def run_answer(row: dict[str, Any]) -> tuple[Any, ...]:
    """*row*'s :data:`..runs.RUN_COLUMNS`: its instants guarded (``sane``), and ``odd``
    naming those out of range with their text (NULL when none is)."""
    odd = [
        f"{name}={timestamp_text(row[name])}"
        for name in ("slot", "started_at", "finished_at")
        if row[name] is not None and not in_range(row[name])
    ]
    return (
        sane(row["slot"]),
        sane(row["started_at"]),
        sane(row["finished_at"]),
        row["outcome"],
        row["error"],
        row["host"],
        row["pid"],
        row["attempt"],
        row["manual"],
        ", ".join(odd) or None,
    )


def owner_gone(x: Exec, run: dict[str, Any], holder: str | None, ttl: float | None) -> bool:
    """``crashes.owner_gone`` of *run*, checked by the locker *holder*, the members' time
    to live *ttl* (true only where the SQL condition is true: NULL is not)."""
    owner = run["holder"]
    if owner is None:
        return True
    if holder is None or ttl is None or owner == holder:
        return False
    now = x.now
    before = now - seconds(ttl)
    if not run["started_at"] < before:
        return False
    members = x.db.table("members")
    theirs = members.get(owner)
    if theirs is not None and theirs["expires_at"] > now:
        return False
    mine = members.get(holder)
    return mine is not None and mine["expires_at"] > now and mine["since"] <= before


def sessions_gone(x: Exec, run: dict[str, Any], holder: str | None) -> bool:
    """``crashes.sessions_gone`` of *run* (whose own session is gone), checked by *holder*:
    its owner's members row names a session that is gone from this same server."""
    owner = run["holder"]
    if owner is None or holder is None or owner == holder:
        return False
    member = x.db.table("members").get(owner)
    return (
        member is not None
        and member.get("session") is not None
        and member.get("server_started") == x.server.started
        and not x.session_alive(member["session"])
    )


def last_sign_of_life(x: Exec, run: dict[str, Any], ttl: float | None) -> Any:
    """``crashes.last_sign_of_life`` of *run*: its owner's last heartbeat (its members row's
    expiry less *ttl*), within [its claim, now]; now without a members row."""
    now = x.now
    member = None if run["holder"] is None else x.db.table("members").get(run["holder"])
    if member is None or ttl is None:
        return max(run["started_at"], now)
    return max(run["started_at"], min(now, member["expires_at"] - seconds(ttl)))


def json_instant(value: Any) -> str | None:
    """``to_jsonb`` of a ``timestamptz`` in a UTC session (``2026-03-01T09:00:05.3+00:00``)."""
    if value is None:
        return None
    text = timestamp_text(value)
    if "infinity" in text:
        return text
    return text.replace(" ", "T", 1).removesuffix("+00") + "+00:00"


def kept_attempts(row: dict[str, Any]) -> list[Any]:
    """``crashes.KEPT_ATTEMPTS`` of *row*: its earlier attempts (a JSON array; anything
    else starts afresh) with its own attempt appended, as the JSON value stored."""
    earlier = jsonb_value(row["attempts"])
    kept = list(earlier) if isinstance(earlier, list) else []
    kept.append(
        {
            "attempt": row["attempt"],
            "started_at": json_instant(row["started_at"]),
            "finished_at": json_instant(row["finished_at"]),
            "outcome": row["outcome"],
            "error": row["error"],
            "host": row["host"],
            "pid": row["pid"],
        }
    )
    return kept


def taken_over(row: dict[str, Any], attempt: int) -> bool:
    """``crashes.TAKEN_OVER``: whether a takeover claiming *attempt* may take *row*."""
    return row["attempt"] == attempt - 1 and (
        row["outcome"] in _RETRIED or (row["outcome"] in _CUT and row["attempt"] == 1)
    )


# -- the crash check ---------------------------------------------------------------------------


def _crashed(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``crashed_sql``: mark ``crashed`` the unfinished runs (not ``$1``:``$2``'s) whose
    session is gone and whose owner is gone (:func:`owner_gone`); answer them."""
    host, pid, holder, ttl = args
    marked = []
    frozen: list[int] = []  # a frozen holder's sessions: ended, marked at the next check
    for key, r in sorted(x.db.unfinished().items()):
        if r["finished_at"] is not None or r["session"] is None:
            continue
        if _own(r, host, pid):
            continue
        if x.session_alive(r["session"]):
            if r["holder"] is not None and r["session"] != x.pid and owner_gone(x, r, holder, ttl):
                frozen.append(r["session"])
            continue
        expired = owner_gone(x, r, holder, ttl)
        if not (expired or sessions_gone(x, r, holder)):
            continue
        why = (
            "lock session gone"
            if r["holder"] is None
            else "lock session and membership gone"
            if expired
            else "lock session and membership session gone"
        )
        new = x.db.update(
            "runs",
            key,
            outcome="crashed",
            finished_at=last_sign_of_life(x, r, ttl),
            error=f"its replica ({r['host']}:{r['pid']}) died mid-run: {why}",
        )
        marked.append((key[0], *run_answer(new)))
    for pid in frozen:  # pg_terminate_backend: the backend exits (its run marked next time)
        session = x.server.sessions.get(pid)
        if session is not None:
            x.server.end_session(session, "terminated by pg_terminate_backend")
    return rows(["job", *RUN_COLUMNS], *marked)


def _own(r: dict[str, Any], host: str | None, pid: int | None) -> bool:
    """Whether ``NOT (r.host = $1 AND r.pid = $2)`` is not true (NULL counts as own)."""
    same_host = None if host is None else r["host"] == host
    same_pid = None if pid is None else r["pid"] == pid
    # false AND anything is false, and NOT false is true: only then is the run not its own
    return not (same_host is False or same_pid is False)


# -- the takeover ------------------------------------------------------------------------------


def _recover(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``recover_sql``: lock ``$1`` (unless the job is paused) and take the slot's row over
    as attempt ``$6`` (:func:`taken_over`), or insert it when there is none; a lock granted
    for a row that could not be taken over is given back."""
    key, job, slot, host, pid, attempt, holder = args
    control = x.db.get("control", job)
    paused = control is not None and control["paused_at"] is not None
    got = False if paused else x.try_lock(key)
    started = None
    if got:
        now = x.now
        old = x.db.get("runs", (job, slot))
        if old is None:
            x.db.put(
                "runs", (job, slot), _new_run(job, slot, host, pid, x.pid, attempt, holder, now)
            )
            started = now
        elif taken_over(old, attempt):
            x.db.update(
                "runs",
                (job, slot),
                host=host,
                pid=pid,
                session=x.pid,
                holder=holder,
                attempts=kept_attempts(old),
                started_at=now,
                finished_at=None,
                outcome=None,
                error=None,
                attempt=attempt,
                retry_at=None,
            )
            started = now
    undone = x.unlock(key) if got and started is None else None
    return rows(
        ["ran", "paused", "got", "started_at", "undone"], (False, paused, got, started, undone)
    )


def _new_run(
    job: str,
    slot: Any,
    host: str,
    pid: int,
    session: int,
    attempt: int,
    holder: str | None,
    now: Any,
) -> dict[str, Any]:
    return {
        "job": job,
        "slot": slot,
        "host": host,
        "pid": pid,
        "started_at": now,
        "finished_at": None,
        "outcome": None,
        "error": None,
        "session": session,
        "attempt": attempt,
        "manual": False,
        "holder": holder,
        "attempts": None,
        "retry_at": None,
    }


# -- retries left behind -----------------------------------------------------------------------


def _retry_due(x: Exec, args: tuple[Any, ...]) -> str:
    """``retry_due_sql``: note when attempt ``$3`` of the slot is due (``$4``), while the
    row is the failed attempt before it."""
    job, slot, attempt, due = args
    r = x.db.get("runs", (job, slot))
    if r is None or attempt is None or r["attempt"] != attempt - 1 or r["outcome"] not in _RETRIED:
        return status("UPDATE", 0)
    x.db.update("runs", (job, slot), retry_at=due)
    return status("UPDATE", 1)


def _retries_pending(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``retries_pending_sql``: the jobs with a retry due ``$1`` seconds ago or more."""
    (margin,) = args
    before = x.now - seconds(margin)
    jobs = sorted(
        {
            j
            for (j, _), r in x.db.retrying().items()  # (runs whose retry_at is not NULL)
            if r["retry_at"] <= before
        }
    )
    return rows(["job"], *((j,) for j in jobs))


def _retries_due(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``retries_due_sql``: take (clear and answer) the retries of the jobs ``$1`` due
    ``$2`` seconds ago or more whose attempt failed and whose owner is gone."""
    jobs, margin, holder, ttl = args
    wanted = set(jobs or ())
    before = x.now - seconds(margin)
    taken = []
    mine = [item for job in sorted(wanted) for item in x.db.runs_of(job).items()]
    for key, r in sorted(mine):
        if key[0] not in wanted or r["retry_at"] is None or not r["retry_at"] <= before:
            continue
        if r["finished_at"] is None or r["outcome"] not in _RETRIED:
            continue
        if not owner_gone(x, r, holder, ttl):
            continue
        new = x.db.update("runs", key, retry_at=None)
        taken.append((key[0], *run_answer(new)))
    return rows(["job", *RUN_COLUMNS], *taken)
