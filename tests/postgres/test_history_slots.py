"""``python -m cronlock history JOB --slots``: every slot of a job and its fate, from the
ledger alone (DESIGN.md §3a), against the real server."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock import Scheduler, SlotsDecided
from cronlock._records import PAUSED_BEFORE_START
from cronlock.postgres import PostgresLocker
from cronlock.postgres._sql.tables import LedgerTable, quote_ident

from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

S = timedelta(seconds=1)


@pytest.fixture
async def schema(admin: Any) -> AsyncIterator[str]:
    name = f"slots_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


def _spec(**changes: Any) -> str:
    spec = {
        "schedule": {"kind": "every", "micros": 10_000_000, "anchor": "1970-01-01T00:00:00+00:00"},
        "jitter": None,
        "misfire_grace": 60.0,
        "start_at": None,
        "stop_at": None,
    }
    return json.dumps({**spec, **changes})


async def _ledger(pg_dsn: str, schema: str) -> LedgerTable:
    done = await cli("migrate", "--dsn", pg_dsn, "--schema", schema)
    assert done.returncode == 0, done.stderr
    return LedgerTable(schema=schema)


async def _slots(pg_dsn: str, schema: str, job: str, *extra: str) -> Any:
    done = await cli("history", job, "--slots", "--json", "--dsn", pg_dsn, "--schema", schema,
                     *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_each_slot_of_the_window_has_its_fate(pg_dsn: str, schema: str, admin: Any) -> None:
    table = await _ledger(pg_dsn, schema)
    now = await admin.fetchval("SELECT clock_timestamp()")
    t0 = datetime.fromtimestamp((now.timestamp() // 10) * 10 - 3600, UTC)
    await admin.execute(
        f"""INSERT INTO {table.jobs} (job, schedule, first_seen, spec)
            VALUES ('report', 'every 10s', $1, $2::jsonb)""",
        t0 - timedelta(hours=1),
        _spec(),
    )

    async def run(
        slot: datetime, started: datetime, outcome: str, error: str | None = None
    ) -> None:
        await admin.execute(
            f"""INSERT INTO {table.runs} (job, slot, host, pid, started_at, finished_at,
                                          outcome, error)
                VALUES ('report', $1, 'h', 7, $2, $2, $3, $4)""",
            slot, started, outcome, error,
        )  # fmt: skip

    async def record(first: datetime, last: datetime, fate: str, reason: str,
                     into: datetime | None = None) -> None:  # fmt: skip
        await admin.execute(
            f"""INSERT INTO {table.slots} (job, slot, last_slot, fate, reason, into_slot, holder)
                VALUES ('report', $1, $2, $3, $4, $5, 'replica-1')""",
            first, last, fate, reason, into,
        )  # fmt: skip

    await run(t0, t0 + 0.2 * S, "succeeded")
    await record(t0 + 10 * S, t0 + 10 * S, "missed", "owed: the server could not be reached")
    await run(t0 + 10 * S, t0 + 40 * S, "failed", "ValueError")  # the owed slot ran late
    await record(t0 + 20 * S, t0 + 50 * S - timedelta(microseconds=1), "coalesced",
                 "no replica ran them", t0 + 50 * S)  # fmt: skip
    await run(t0 + 50 * S, t0 + 55 * S, "succeeded")
    await record(t0 + 60 * S, t0 + 60 * S, "skipped", "overlap='skip': still running")
    await run(t0 + 80 * S, t0 + 80 * S, "cancelled", PAUSED_BEFORE_START)
    # (t0 + 70 s: neither run nor record)

    entries = await _slots(pg_dsn, schema, "report", "--since", t0.isoformat(), "--until",
                           (t0 + 85 * S).isoformat())  # fmt: skip
    got = [(datetime.fromisoformat(e["slot"]) - t0, e["fate"], e["into"]) for e in entries]
    into = (t0 + 50 * S).isoformat()
    assert got == [
        (0 * S, "ran", None),
        (10 * S, "ran_late", None),
        (20 * S, "coalesced", into),
        (30 * S, "coalesced", into),
        (40 * S, "coalesced", into),
        (50 * S, "ran_late", None),
        (60 * S, "skipped", None),
        (70 * S, "missed", None),
        (80 * S, "skipped", None),
    ]
    by_offset = {datetime.fromisoformat(e["slot"]) - t0: e for e in entries}
    assert by_offset[0 * S]["reason"] == "" and by_offset[0 * S]["outcome"] == "succeeded"
    assert by_offset[10 * S]["reason"] == (
        "owed: the server could not be reached; began 30.0s after its slot"
    )
    assert by_offset[10 * S]["outcome"] == "failed"
    assert by_offset[20 * S]["reason"] == "no replica ran them"
    assert by_offset[60 * S]["by"] == "replica-1"
    assert by_offset[70 * S]["reason"] == "no replica claimed it, nor said why"
    assert by_offset[80 * S]["reason"] == "paused before its slot began"
    assert all(e["slot"].endswith("+00:00") for e in entries)

    # The text form: a summary line, then one line a slot.
    text = await cli("history", "report", "--slots", "--dsn", pg_dsn, "--schema", schema,
                     "--since", t0.isoformat(), "--until", (t0 + 85 * S).isoformat())  # fmt: skip
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == (
        "9 slot(s) of 'report', oldest first: 1 ran, 2 ran late, 3 coalesced, 1 missed, 2 skipped"
    )
    assert len(lines) == 2 + 9

    # Up to now: the slots of the last minute, still within their grace, are left out.
    recent = await _slots(pg_dsn, schema, "report", "--since", "5m")
    last = datetime.fromisoformat(recent[-1]["slot"])
    assert now - last > timedelta(seconds=60)
    assert all(e["fate"] == "missed" for e in recent)


async def test_a_job_the_ledger_cannot_rebuild_or_does_not_know(
    pg_dsn: str, schema: str, admin: Any
) -> None:
    table = await _ledger(pg_dsn, schema)
    await admin.execute(f"INSERT INTO {table.jobs} (job, schedule) VALUES ('old', 'custom')")
    unknown = await cli("history", "olf", "--slots", "--dsn", pg_dsn, "--schema", schema)
    assert unknown.returncode == 1
    assert "olf" in unknown.stderr and "old" in unknown.stderr  # the close match
    custom = await cli("history", "old", "--slots", "--dsn", pg_dsn, "--schema", schema)
    assert custom.returncode == 1
    assert "cannot rebuild the slots of 'old' (custom)" in custom.stderr
    naive = await cli("history", "old", "--slots", "--since", "2030-01-01T00:00:00",
                      "--dsn", pg_dsn, "--schema", schema)  # fmt: skip
    assert naive.returncode == 2
    assert "names no zone" in naive.stderr


async def test_a_replica_tells_the_slots_its_busy_job_skipped(pg_dsn: str, schema: str) -> None:
    """A live scheduler: a job of every second whose runs take 2.5 s, overlap='skip'. Every
    slot from its first run on reads ran or skipped, as the replica's events said."""
    locker = PostgresLocker(pg_dsn, schema=schema, application_name="slots-test")
    scheduler = Scheduler(locker=locker)
    decided: list[SlotsDecided] = []
    scheduler.subscribe(lambda e: decided.append(e) if isinstance(e, SlotsDecided) else None)

    @scheduler.every(1, name="busy", overlap="skip")
    async def busy() -> None:
        await asyncio.sleep(2.5)

    async with scheduler:
        while sum(e.fate == "skipped" for e in decided) < 3:
            await asyncio.sleep(0.2)
    entries = await _slots(pg_dsn, schema, "busy", "--since", "1m")
    fates = [e["fate"] for e in entries]
    first = fates.index("ran")
    told = {e.slot.isoformat(): e.fate for e in decided}
    for entry in entries[first:]:
        if entry["slot"] in told:
            assert entry["fate"] == told[entry["slot"]], entry
            assert entry["reason"] == "overlap='skip': the job was still running"
        else:
            assert entry["fate"] in ("ran", "ran_late"), entry
    assert fates.count("skipped") >= 3
