"""Statements about a session itself, not about the ledger: its settings, its backend."""

from __future__ import annotations

__all__ = (
    "BACKEND_PID_SQL",
    "END_LOST_BACKEND_OLD_SQL",
    "END_LOST_BACKEND_SQL",
    "PREPARED_AS_SQL",
    "READ_ONLY_SQL",
    "SAME_BACKEND_SQL",
    "cache_probe_sql",
    "set_config_sql",
)

BACKEND_PID_SQL = "SELECT pg_backend_pid()"
"""The pid of the backend serving this statement (a pooler's changes between statements)."""

END_LOST_BACKEND_SQL = """
    SELECT pg_terminate_backend(a.pid, $3::bigint) AS ended FROM pg_stat_activity a
    WHERE a.pid = $1::integer AND a.pid <> pg_backend_pid()
      AND a.usename = current_user AND a.application_name = $2::text"""
"""End the backend of a lock session this client lost (``$1`` its pid, ``$2`` the
application name it was given), waiting up to ``$3`` milliseconds for it to exit (PostgreSQL
>= 14; before, :data:`END_LOST_BACKEND_OLD_SQL`). A session whose client was cut off
(a network cut, an answer lost) lives on the server until its keepalives fail, holding its
advisory locks: no replica could run those jobs meanwhile. Only a backend of this role and
of this replica's application name is ended; none: no row."""

END_LOST_BACKEND_OLD_SQL = """
    SELECT pg_terminate_backend(a.pid) AS ended FROM pg_stat_activity a
    WHERE a.pid = $1::integer AND a.pid <> pg_backend_pid()
      AND a.usename = current_user AND a.application_name = $2::text"""
""":data:`END_LOST_BACKEND_SQL` before PostgreSQL 14 (no waiting: ``$1``, ``$2`` only)."""

READ_ONLY_SQL = (
    "SELECT pg_is_in_recovery() AS recovery, "
    "current_setting('transaction_read_only')::boolean AS read_only"
)
"""Whether this server cannot take writes: ``recovery``, a standby (in recovery, hot or
being promoted); ``read_only``, a session whose transactions are read-only (the server's or
the database's ``default_transaction_read_only``, as a provider sets it on a full disk)."""

SAME_BACKEND_SQL = "SELECT CASE WHEN pg_backend_pid() = $1::integer THEN true END"
"""``$1`` the pid the connection announced: true on that backend, NULL on another (a pooler
handed the statement on)."""


def cache_probe_sql(token: str) -> str:
    """The backend serving it, a statement of its own (*token*, hex digits, tells it from
    another client's); sent inside a transaction, then looked for by
    :data:`PREPARED_AS_SQL` on the same backend: with asyncpg's statement cache on it stays
    prepared under a name of asyncpg's (``__asyncpg_stmt_N__``), without it it leaves no
    trace."""
    if not token.isalnum():
        raise ValueError(f"a probe's token is letters and digits, not {token!r}")
    return f"SELECT pg_backend_pid() /* cronlock: is the statement cache on? {token} */"


PREPARED_AS_SQL = (
    "SELECT coalesce(array_agg(name::text), '{}') FROM pg_prepared_statements WHERE statement = $1"
)
"""``$1`` a statement's text: the names it is prepared under on this backend (none when
it was sent unnamed)."""


def set_config_sql(settings: int) -> str:
    """Set *settings* session settings in one round trip: ``$1`` name, ``$2`` value, ...."""
    calls = ", ".join(f"set_config(${2 * i + 1}, ${2 * i + 2}, false)" for i in range(settings))
    return f"SELECT {calls}"
