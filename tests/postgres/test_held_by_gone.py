"""A holder killed mid-run with real replica processes: the slots it held are told, in both
modes (finding E6).

Replica A runs the job's first slot for good (its run never ends) and is killed with
SIGKILL; replica B, started after A took the job, is refused the slots while A's hold
stands. In session mode the server ends A's session, and its lock, at once: B runs the
next slot. In lease mode A's lease (3 s here) stands until it lapses: the claim of B that
takes it over is told whose it was, and B tells the slots due since A's last renewal
coalesced into its run (``SlotsDecided``, and a record in the ledger for ``history
--slots``) instead of leaving them as ``locked`` refusals nobody explains. The logic runs
in the simulation (scenario ``holder-killed``); this is its real-process, real-server case.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from .conftest import Coordination
from .test_replicas import Record, Replica, booted_then_go

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def test_the_slots_a_killed_holder_held_are_told(
    coordination: Coordination, admin: Any
) -> None:
    job = f"gone-{uuid.uuid4()}"
    table = coordination.table(f"gone_{uuid.uuid4().hex[:10]}")
    pooled = ("--pool",) if coordination.mode == "lease" else ()
    flags = ["--table", table.table, *coordination.args, *pooled, "--misfire-grace", "30"]
    dsn = coordination.dsn
    # A holds the job from its first slot until it is killed (hold < 0).
    a = Replica(dsn, job, 1, None, 60, hold=-1, extra=flags)
    b: Replica | None = None
    try:
        start = await asyncio.to_thread(booted_then_go, [a])
        await eventually(lambda: a.of("start"), "replica A starts its run", 60)
        b = Replica(dsn, job, 2, start, 60, hold=0.2, extra=flags)
        await eventually(lambda: b is not None and b.of("running"), "replica B running", 60)
        # B is refused a slot or two while A runs (A skips them as overlaps).
        await eventually(lambda: b is not None and b.of("skipped"), "B refused a slot", 30)
        killed_at = time.time()
        a.kill()

        def resumed() -> list[Record]:
            assert b is not None
            return [r for r in b.of("start") if r["slot"] > killed_at]

        [first, *_] = await eventually(resumed, "B runs the job again after the kill", 60)
        await asyncio.sleep(1.0)  # the account is told as the run starts; let it be read
        decided = list(b.of("decided"))
        recorded: list[Any] = []
        if coordination.mode == "lease":
            into = datetime.fromtimestamp(first["slot"], UTC)

            async def coalesced() -> list[Any]:
                found = await _records(admin, table, job)
                return found if any(r["into_slot"] == into for r in found) else []

            # Written with B's upkeep, batched: other records (A's overlap skips) may be
            # there first.
            recorded = await eventually(coalesced, "B's record of the slots in the ledger", 30)
    finally:
        a.close()
        if b is not None:
            b.close()
        await _drop(admin, table)
    held = [s for s in range(int(start), int(first["slot"])) if s > killed_at]
    told = [d for d in decided if d["fate"] == "coalesced" and d["into"] == first["slot"]]
    covered = {s for s in held if any(d["slot"] <= s <= d["last"] for d in told)}
    if coordination.mode == "session":
        # The lock went with A's session: B took the job at its next claim.
        assert len(held) <= 2, (held, decided)
        return
    # Lease mode: A's lease stood a while after the kill; every slot due meanwhile (after
    # A's last renewal, which was before the kill) is told coalesced into B's run, naming
    # the gone holder, in B's events and in the ledger.
    assert held, (killed_at, first)
    assert covered == set(held), (held, decided)
    assert all("lease lapsed unreleased" in d["reason"] for d in told), told
    assert any(
        r["fate"] == "coalesced" and r["into_slot"].timestamp() == first["slot"] for r in recorded
    ), recorded


@pytest.mark.parametrize("coordination", ["session"], indirect=True)
async def test_the_slots_a_frozen_session_holder_held_are_told(
    coordination: Coordination, admin: Any
) -> None:
    """Session mode, a holder stopped (SIGSTOP) mid-run: its lock session stays, so the
    others are refused the job's slots until the crash check ends that session (its
    members row expired: 3 s here, heartbeats every second). The claim that then takes the
    job learns that the job's last run is A's and did not end, and tells the slots A held
    since it froze coalesced into its own run, naming A."""
    job = f"frozen-{uuid.uuid4()}"
    table = coordination.table(f"frozen_{uuid.uuid4().hex[:10]}")
    flags = ["--table", table.table, *coordination.args, "--misfire-grace", "60"]
    flags += ["--members-every", "1"]
    dsn = coordination.dsn
    a = Replica(dsn, job, 1, None, 90, hold=-1, extra=flags)
    b: Replica | None = None
    try:
        start = await asyncio.to_thread(booted_then_go, [a])
        await eventually(lambda: a.of("start"), "replica A starts its run", 60)
        b = Replica(dsn, job, 2, start, 90, hold=0.2, extra=flags)
        await eventually(lambda: b is not None and b.of("running"), "replica B running", 60)
        await eventually(lambda: b is not None and b.of("skipped"), "B refused a slot", 30)
        frozen_at = time.time()
        a.proc.send_signal(signal.SIGSTOP)

        def resumed() -> list[Record]:
            assert b is not None
            return [r for r in b.of("start") if r["slot"] > frozen_at]

        [first, *_] = await eventually(resumed, "B runs the job while A is frozen", 60)
        await asyncio.sleep(1.0)  # the account is told as the run starts; let it be read
        decided = list(b.of("decided"))
    finally:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        a.close()
        if b is not None:
            b.close()
        await _drop(admin, table)
    held = [s for s in range(int(start) + 1, int(first["slot"])) if s > frozen_at]
    told = [d for d in decided if d["fate"] == "coalesced" and d["into"] == first["slot"]]
    covered = {s for s in held if any(d["slot"] <= s <= d["last"] for d in told)}
    assert held, (frozen_at, first)  # A's session stood a while: slots were held
    assert covered == set(held), (held, decided)
    assert all("lock session ended mid-run" in d["reason"] for d in told), told


async def _records(admin: Any, table: LedgerTable, job: str) -> list[Any]:
    try:
        return list(
            await admin.fetch(
                f"SELECT slot, last_slot, fate, reason, into_slot FROM {table.slots} "
                "WHERE job = $1 ORDER BY slot",
                job,
            )
        )
    except Exception:  # not made yet
        return []


async def _drop(admin: Any, table: LedgerTable) -> None:
    names = ", ".join(
        getattr(table, name) for name in ("runs", "jobs", "control", "leases", "members", "slots")
    )
    await admin.execute(f"DROP TABLE IF EXISTS {names}")
