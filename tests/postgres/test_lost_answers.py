"""A claim that reached the server and committed, its answer lost (issue 48, E5), on the
real server: the lock session left behind is ended, the claim given back, and the slot runs
late, once; no row stays unfinished."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from cronlock import RunContext, Scheduler, SlotsDecided, every
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.sessions import END_LOST_BACKEND_SQL
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

from ..eventually import eventually
from .proxy import TcpProxy, via

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"lost_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


async def test_a_lost_sessions_backend_is_ended_only_if_it_is_this_replicas(pg_dsn: str) -> None:
    mine = await asyncpg.connect(pg_dsn, server_settings={"application_name": "cronlock:t:1"})
    other = await asyncpg.connect(pg_dsn, server_settings={"application_name": "someone"})
    me = await asyncpg.connect(pg_dsn, server_settings={"application_name": "cronlock:t:1"})
    try:
        pid, other_pid = mine.get_server_pid(), other.get_server_pid()
        assert await me.fetch(END_LOST_BACKEND_SQL, other_pid, "cronlock:t:1", 1000) == []
        assert await me.fetch(END_LOST_BACKEND_SQL, me.get_server_pid(), "cronlock:t:1", 1000) == []
        ended = await me.fetch(END_LOST_BACKEND_SQL, pid, "cronlock:t:1", 5000)
        assert [row["ended"] for row in ended] == [True]
        alive = {r["pid"] for r in await me.fetch("SELECT pid FROM pg_stat_activity")}
        assert pid not in alive and other_pid in alive
    finally:
        for conn in (mine, other, me):
            conn.terminate()


@pytest.mark.parametrize("mode", ["session", "lease"])
async def test_a_claim_whose_answer_is_lost_runs_late_once(
    pg_dsn: str, admin: Any, schema: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cronlock")
    host, port = "127.0.0.1", int(pg_dsn.split("@")[1].split(":")[1].split("/")[0])
    proxy = TcpProxy(host, port)
    await proxy.start()
    locker = PostgresLocker(
        via(pg_dsn, proxy.port), schema=schema, mode=mode, sessions=1,  # type: ignore[arg-type]
        statement_timeout=1.0, heartbeat=60.0, claim_ahead=0,
        # Statements kept prepared (the first claim's): the next claim is one round trip,
        # which reaches the server whole; without, its answer to Parse would be the one lost.
        connect_kwargs={"statement_cache_size": 100},
    )  # fmt: skip
    scheduler = Scheduler(locker=locker)
    ran: list[datetime] = []
    told: list[SlotsDecided] = []
    scheduler.subscribe(lambda e: told.append(e) if isinstance(e, SlotsDecided) else None)

    async def job(ctx: RunContext) -> None:
        ran.append(ctx.slot)

    scheduler.add_job(job, every(4), name="probe", misfire_grace=60)
    runs = LedgerTable(schema=schema).runs
    given_back = "whose answer was lost had reached the ledger"
    lost: list[float] = []
    try:
        async with scheduler:
            await eventually(lambda: len(ran) >= 1, "a first run")
            first = ran[0]
            # Just before a slot: its claim goes out on a connection whose answers are lost
            # from now on, reaches the server and commits. On a busy machine the session may
            # be found dead before the claim is sent: then try again at a later slot (at
            # most six times) until a claim did commit, its answer lost.
            for _ in range(6):
                slot = max(ran).timestamp() + 4
                await asyncio.sleep(max(0.0, slot - 0.1 - time.time()))
                proxy.deafen()
                lost.append(slot)
                await eventually(
                    lambda: any(s.timestamp() == slot for s in ran),  # noqa: B023 (awaited here)
                    "the slot run late",
                )
                if any(given_back in r.getMessage() for r in caplog.records):
                    break
            await eventually(lambda: max(ran).timestamp() > lost[-1], "a run after it")
        rows = await admin.fetch(f"SELECT slot, outcome FROM {runs} ORDER BY slot")
    finally:
        await proxy.close()
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if given_back in m], said
    assert len(ran) == len(set(ran))  # no slot twice
    by_slot = {row["slot"].timestamp(): row["outcome"] for row in rows}
    for slot in lost:  # each slot whose claim's answer was lost ran late
        assert by_slot[slot] == "succeeded"
    assert None not in by_slot.values()  # no row stays unfinished
    # Every slot from the first to the last that ran either ran or was told coalesced.
    coalesced = {e.slot.timestamp() for e in told if e.fate == "coalesced"}
    for t in range(int(first.timestamp()), int(max(ran).timestamp()) + 1, 4):
        assert t in by_slot or t in coalesced, t
