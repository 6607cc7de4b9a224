"""Statements about a session itself, not about the ledger: its settings, its backend."""

from __future__ import annotations

__all__ = ("BACKEND_PID_SQL", "HEARTBEAT_SQL", "set_config_sql")

BACKEND_PID_SQL = "SELECT pg_backend_pid()"
"""The pid of the backend serving this statement (a pooler's changes between statements)."""

HEARTBEAT_SQL = "SELECT 1"
"""A round trip that proves a session alive."""


def set_config_sql(settings: int) -> str:
    """Set *settings* session settings in one round trip: ``$1`` name, ``$2`` value, ...."""
    calls = ", ".join(f"set_config(${2 * i + 1}, ${2 * i + 2}, false)" for i in range(settings))
    return f"SELECT {calls}"
