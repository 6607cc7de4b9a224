"""The backend's errors become typed LockErrors at one boundary (``backend_errors``)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from cronlock import LockError, ServerError, SessionLost, StatementTimeout
from cronlock.postgres._conn.errors import SessionGone, backend_errors, kind_of

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (TimeoutError(), StatementTimeout),
        (
            asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
            StatementTimeout,
        ),
        (asyncpg.AdminShutdownError("terminating connection"), SessionLost),
        (asyncpg.ProtocolViolationError("unsupported startup parameter"), SessionLost),
        (asyncpg.ConnectionDoesNotExistError("connection was closed"), SessionLost),
        (ConnectionResetError(), SessionLost),
        (asyncpg.UndefinedTableError("relation does not exist"), ServerError),
    ],
)
def test_each_backend_error_has_its_kind(error: BaseException, kind: type[LockError]) -> None:
    assert kind_of(error) is kind
    with pytest.raises(kind) as raised, backend_errors("the claim statement failed"):
        raise error
    assert raised.value.__cause__ is error
    assert str(raised.value).startswith("the claim statement failed: ")


def test_a_replaced_session_is_a_lost_one() -> None:
    with (
        pytest.raises(SessionLost, match="try again"),
        backend_errors("x", session_lost="try again"),
    ):
        raise SessionGone


async def test_real_errors_of_a_real_server(pg_dsn: str, admin: Any) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(ServerError), backend_errors("a read failed"):
            await conn.fetch("SELECT * FROM no_such_table_for_cronlock")
        with pytest.raises(StatementTimeout), backend_errors("a slow read"):
            async with asyncio.timeout(0.2):
                await conn.fetch("SELECT pg_sleep(5)")
    finally:
        conn.terminate()
    other = await asyncpg.connect(pg_dsn)
    pid = other.get_server_pid()
    await admin.execute("SELECT pg_terminate_backend($1)", pid)
    with pytest.raises(SessionLost), backend_errors("after a terminate"):
        await other.fetchval("SELECT 1")
    other.terminate()
