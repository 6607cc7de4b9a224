"""The election's SQL and the fencing rule its settings must obey (see _elector)."""

from __future__ import annotations

from ..._errors import ConfigError
from .._conn.source import Keepalives

__all__ = (
    "ACQUIRE_SQL",
    "ELECTOR_KEEPALIVES",
    "HEARTBEAT_SQL",
    "SETTINGS_SQL",
    "check_fencing",
)

# Short enough that a silent cut releases the lock in a few seconds; long enough, relative
# to the 0.75 s default lease, that the server cannot release it before the lease lapses.
ELECTOR_KEEPALIVES = Keepalives(idle=2, interval=1, count=2, user_timeout=3.0)

# Server-side slack, beyond the lease, that the constructor insists on.
MIN_MARGIN = 1.0

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

# A bigint advisory key k shows in pg_locks as classid = high 32 bits, objid = low 32 bits,
# objsubid = 1 (objsubid 2 is the two-int4 form). Checked against our own backend only:
# pg_try_advisory_lock is re-entrant, so asking it again would prove nothing.
HEARTBEAT_SQL = """
SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
  AND granted AND mode = 'ExclusiveLock' AND objsubid = 1
  AND classid = (($1::int8 >> 32) & 4294967295)::oid AND objid = ($1::int8 & 4294967295)::oid)
"""

# The session's own view of the settings the fencing relies on, in seconds.
SETTINGS_SQL = """
SELECT name, setting::float8 * CASE unit WHEN 'ms' THEN 0.001 ELSE 1 END AS seconds
FROM pg_settings
WHERE name IN ('idle_session_timeout', 'tcp_keepalives_idle', 'tcp_keepalives_interval',
               'tcp_keepalives_count', 'tcp_user_timeout')
"""


def check_fencing(
    *,
    beat: float,
    lease: float,
    takeover: float,
    idle_session_timeout: float,
    keepalives: Keepalives,
) -> None:
    """Refuse settings under which the server could free the lock before the lease ends."""
    if beat >= lease:
        raise ConfigError(
            f"heartbeat_interval ({beat:g}s) must be shorter than lease "
            f"({lease:g}s), or every lease lapses before it can be renewed"
        )
    if takeover < lease:
        raise ConfigError(
            f"takeover_delay ({takeover:g}s) must be at least lease "
            f"({lease:g}s): after a connection reset the old leader's lease must "
            "have lapsed before the new leader starts"
        )
    ka = keepalives
    if ka.user_timeout is None:
        raise ConfigError(
            "keepalives.user_timeout must be set for an elector: without it, how soon "
            "the server drops a silent client depends on the host's TCP settings"
        )
    # The earliest the server may notice a silent client, measured from the last packet
    # it received: no keepalive probe before `idle`, no user-timeout abort before
    # `user_timeout`, no idle-session abort before `idle_session_timeout`. Whole seconds
    # and milliseconds, as configure_session and PostgreSQL round them.
    floors = {
        "idle_session_timeout": int(idle_session_timeout * 1000) / 1000,
        "keepalives.idle": float(int(ka.idle)),
        "keepalives.user_timeout": int(ka.user_timeout * 1000) / 1000,
    }
    field, floor = min(floors.items(), key=lambda item: item[1])
    if floor < 2 * lease or floor - lease < MIN_MARGIN:
        raise ConfigError(
            f"{field} ({floor:g}s) is too short for lease ({lease:g}s): it must be "
            f"at least twice the lease and {MIN_MARGIN:g}s longer, so the server cannot "
            "release the lock before the old leader's lease has lapsed"
        )
