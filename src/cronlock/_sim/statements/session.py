"""Statements about a session and the schema: settings, transactions, identity, the
catalog reads a locker makes at connect (the ledger always exists, current, in the model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...postgres._conn.background import NO_JIT_SQL
from ...postgres._sql import grants, schema, sessions
from ...postgres._sql.failover import SERVER_SQL
from ...postgres._sql.fleet import SERVER_CLOCK_SQL
from ..rows import Row, rows

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = ("register",)


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers."""
    add, prefix = statements.add, statements.add_prefix
    # asyncpg's own transaction statements (conn.transaction()), not the library's.
    add("BEGIN;", _begin)
    add("COMMIT;", _end)
    add("ROLLBACK;", _end)
    prefix(schema.lock_timeout_sql(0).partition("=")[0], _lock_timeout)
    add(NO_JIT_SQL, _status("SET"))
    prefix(sessions.set_config_sql(1).partition("(")[0], _set_config)
    prefix(sessions.cache_probe_sql("0")[: -len("0 */")], _backend_pid)
    add(sessions.BACKEND_PID_SQL, _backend_pid)
    add(sessions.END_LOST_BACKEND_SQL, _end_lost_backend)
    add(sessions.END_LOST_BACKEND_OLD_SQL, _end_lost_backend)
    add(sessions.SAME_BACKEND_SQL, lambda x, a: rows(["case"], (True if a[0] == x.pid else None,)))
    add(sessions.PREPARED_AS_SQL, lambda x, a: rows(["coalesce"], ([],)))
    add(sessions.READ_ONLY_SQL, lambda x, a: rows(["recovery", "read_only"], (False, False)))
    add(SERVER_SQL, _server)
    add(SERVER_CLOCK_SQL, lambda x, a: rows(["clock_timestamp"], (x.now,)))
    add(schema.MIGRATE_LOCK_SQL, _xact_lock)
    add(schema.LEDGER_STATE_SQL, lambda x, a: rows(["state"], (True,)))
    add(grants.MISSING_PRIVILEGES_SQL, lambda x, a: [])  # the model's role may do anything
    for ddl in schema.ledger_ddl(table):  # the ledger exists: its DDL changes nothing
        add(ddl, _status("CREATE"))


def _end_lost_backend(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``END_LOST_BACKEND_SQL``: end backend ``$1`` if it is another one of application
    name ``$2`` (the model has one role); a row (``ended``) when it was there."""
    pid, application_name = args[0], args[1]
    other = x.server.sessions.get(pid)
    if other is None or pid == x.pid or other.application_name != application_name:
        return []
    x.server.end_session(other, "terminated by pg_terminate_backend")
    return rows(["ended"], (True,))


def status(tag: str, count: int | None = None) -> str:
    """The status text of a statement sent with ``execute``: ``"UPDATE 3"``."""
    return tag if count is None else f"{tag} {count}"


def _status(text: str) -> Any:
    return lambda x, a: text


def _begin(x: Exec, args: tuple[Any, ...]) -> str:
    x.session.in_transaction = True
    return "BEGIN"


def _end(x: Exec, args: tuple[Any, ...]) -> str:
    session = x.session
    session.in_transaction = False
    session.lock_timeout = None
    for key in session.xact_locks:
        x.unlock(key)
    session.xact_locks.clear()
    return "COMMIT"


def _lock_timeout(x: Exec, args: tuple[Any, ...]) -> str:
    # Only the statements after it in the transaction see it; the text says the value.
    x.session.lock_timeout = 0.05
    return "SET"


def _set_config(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    values = args[1::2]
    for name, value in zip(args[0::2], values, strict=True):
        if name == "application_name":
            x.session.application_name = value
    return rows([f"set_config{i}" for i in range(len(values))], tuple(values))


def _backend_pid(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return rows(["pg_backend_pid"], (x.pid,))


def _server(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    server = x.server
    return rows(
        ["system", "timeline", "started"], (server.system, f"{server.timeline:08X}", server.started)
    )


def _xact_lock(x: Exec, args: tuple[Any, ...]) -> str:
    # A transaction's migration lock: the ledger exists in the model, so nobody contends.
    x.try_lock(args[0])
    x.session.xact_locks.append(args[0])
    return status("SELECT", 1)
