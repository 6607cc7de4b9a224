"""The election's statements: a session advisory lock (session mode) or a row of the leaders
table (lease mode), and the session's view of the settings its fencing relies on."""

from __future__ import annotations

__all__ = (
    "ACQUIRE_SQL",
    "HEARTBEAT_SQL",
    "LEADERS_EXIST_SQL",
    "SETTINGS_SQL",
    "XACT_LOCK_SQL",
    "leaders_acquire_sql",
    "leaders_ddl",
    "leaders_release_sql",
    "leaders_renew_sql",
)

# Acquire, and only if granted, make the session die after idle_session_timeout of silence
# (PostgreSQL >= 14). That catches a *frozen* client, which keepalives never notice, and
# leaves followers, idle between polls, alone. The CTE runs the try-lock exactly once.
ACQUIRE_SQL = """
WITH l AS (SELECT pg_try_advisory_lock($1::int8) AS got)
SELECT got, set_config('idle_session_timeout',
                       CASE WHEN got THEN $2 ELSE current_setting('idle_session_timeout') END,
                       false)
FROM l
"""
"""``$1`` key, ``$2`` idle_session_timeout in milliseconds (text)."""

# A bigint advisory key k shows in pg_locks as classid = high 32 bits, objid = low 32 bits,
# objsubid = 1 (objsubid 2 is the two-int4 form). Checked against our own backend only:
# pg_try_advisory_lock is re-entrant, so asking it again would prove nothing.
HEARTBEAT_SQL = """
SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
  AND granted AND mode = 'ExclusiveLock' AND objsubid = 1
  AND classid = (($1::int8 >> 32) & 4294967295)::oid AND objid = ($1::int8 & 4294967295)::oid)
"""
"""``$1`` key: whether this backend holds it."""

# The session's own view of the settings the fencing relies on, in seconds.
SETTINGS_SQL = """
SELECT name, setting::float8 * CASE unit WHEN 'ms' THEN 0.001 ELSE 1 END AS seconds
FROM pg_settings
WHERE name IN ('idle_session_timeout', 'tcp_keepalives_idle', 'tcp_keepalives_interval',
               'tcp_keepalives_count', 'tcp_user_timeout')
"""

LEADERS_EXIST_SQL = "SELECT to_regclass($1) IS NOT NULL"
"""``$1`` the leaders table's quoted name: whether it exists."""

XACT_LOCK_SQL = "SELECT pg_advisory_xact_lock($1::bigint)"
"""``$1`` key: serialises concurrent creations of the leaders table."""


def leaders_ddl(table: str) -> list[str]:
    """Create the leaders *table* (quoted, with its schema) and its schema if missing."""
    schema = table.rpartition(".")[0]
    create = f"""CREATE TABLE IF NOT EXISTS {table} (
                    name       text        PRIMARY KEY,
                    holder     text        NOT NULL,
                    expires_at timestamptz NOT NULL,
                    since      timestamptz NOT NULL DEFAULT clock_timestamp()
                )"""
    return [f"CREATE SCHEMA IF NOT EXISTS {schema}", create] if schema else [create]


def leaders_acquire_sql(table: str) -> str:
    """Take election ``$1`` for holder ``$2`` for ``$3`` seconds if it expired or is ours."""
    return f"""INSERT INTO {table} AS l (name, holder, expires_at)
                VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 second')
                ON CONFLICT (name) DO UPDATE
                SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
                    since = CASE WHEN l.holder = EXCLUDED.holder THEN l.since
                                 ELSE clock_timestamp() END
                WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder
                RETURNING true"""


def leaders_renew_sql(table: str) -> str:
    """Extend election ``$1`` of holder ``$2`` by ``$3`` seconds while it is unexpired."""
    return f"""UPDATE {table}
                SET expires_at = clock_timestamp() + $3::float8 * interval '1 second'
                WHERE name = $1 AND holder = $2 AND expires_at > clock_timestamp()
                RETURNING true"""


def leaders_release_sql(table: str) -> str:
    """Expire election ``$1`` of holder ``$2`` now."""
    return f"UPDATE {table} SET expires_at = '-infinity' WHERE name = $1 AND holder = $2"
