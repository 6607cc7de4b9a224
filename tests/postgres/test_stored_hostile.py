"""Hostile rows in the stored schedules' table: one bad row harms nothing but itself (issue 37).

Rows written by hand into ``<table>_schedules`` (every column: huge and negative numbers,
numbers past any float, deep and wide JSON, huge texts, odd Unicode, JSON of the wrong
type) beside good schedules, before the replicas start and while they run; in both
coordination modes. Two replicas (schedulers, each with its ``PostgresLocker``) start,
run each slot of the good schedules once in the fleet, and reject each bad row alone (a
WARNING and a ``ScheduleRejected`` once per revision, its problem noted for the
operators); ``status``, ``history`` and ``schedules list`` (the command line, in processes
of their own) and the dashboard's ``/schedules`` answer, listing the bad rows as
unreadable, with no traceback anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from typing import Any

import asyncpg
import pytest

import cronlock.web
from cronlock import Event, RunContext, Scheduler, ScheduleRejected, cron, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import members
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from ..web.test_app import client
from .conftest import Coordination
from .test_cli_pg import cli

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ANCHOR = "1970-01-01T00:00:00+00:00"
LATE = "9999-12-31T00:00:00+00:00"
EVERY = {"kind": "every", "micros": 1_000_000, "anchor": ANCHOR}


def shown(name: str) -> str:
    """A name as the replicas' WARNING shows it (a long one shortened)."""
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _every(micros: Any) -> str:
    return json.dumps({**EVERY, "micros": micros})


# name: (task, schedule, kwargs, options) as JSON texts (numbers past a float's range are
# spelled in the text: the server's jsonb keeps them as numerics).
HOSTILE: dict[str, tuple[str, str, str, str]] = {
    "bad:micros-1e20": ("report", _every(10**20), "{}", "{}"),
    "bad:micros-1e400": ("report", _every(0).replace('"micros": 0', '"micros": 1e400'), "{}", "{}"),
    "bad:micros-negative": ("report", _every(-(10**6)), "{}", "{}"),
    "bad:micros-float": ("report", _every(1.5e6), "{}", "{}"),
    "bad:micros-text": ("report", _every("1000000"), "{}", "{}"),
    "bad:every-50ms": ("report", _every(50_000), "{}", "{}"),  # past min interval
    "bad:anchor-9999": (
        "report",
        json.dumps({**EVERY, "anchor": "9999-12-31T23:59:59+00:00"}),
        "{}",
        "{}",
    ),
    "bad:anchor-number": ("report", json.dumps({**EVERY, "anchor": 5}), "{}", "{}"),
    "bad:kwargs-1000-deep": ("report", _every(10**6), '{"a": ' + deep(1000) + "}", "{}"),
    "bad:kwargs-40-deep": ("report", _every(10**6), '{"a": ' + deep(40) + "}", "{}"),
    "bad:kwargs-huge": ("report", _every(10**6), json.dumps({"blob": "x" * 1_000_000}), "{}"),
    "bad:kwargs-wide": (
        "report",
        _every(10**6),
        json.dumps({f"k{i}": i for i in range(20_000)}),
        "{}",
    ),
    "bad:kwargs-list": ("report", _every(10**6), "[1, 2]", "{}"),
    "bad:kwargs-text": ("report", _every(10**6), '"tenant"', "{}"),
    "bad:schedule-list": ("report", "[]", "{}", "{}"),
    "bad:schedule-null": ("report", "null", "{}", "{}"),
    "bad:schedule-kind": ("report", '{"kind": "sometimes"}', "{}", "{}"),
    "bad:cron-huge": (
        "report",
        json.dumps(
            {"kind": "cron", "expr": "1," * 500_000 + "2 * * * *", "seconds": False, "tz": "UTC"}
        ),
        "{}",
        "{}",
    ),
    "bad:cron-unicode": (
        "report",
        json.dumps({"kind": "cron", "expr": "\u0663 * * * \u202e*", "seconds": False, "tz": "UTC"}),
        "{}",
        "{}",
    ),
    "bad:cron-tz": (
        "report",
        json.dumps(
            {"kind": "cron", "expr": "* * * * *", "seconds": False, "tz": "../../etc/passwd"}
        ),
        "{}",
        "{}",
    ),
    "bad:daily-no-times": (
        "report",
        json.dumps({"kind": "daily", "at": [], "on": [], "every": 1, "tz": "UTC"}),
        "{}",
        "{}",
    ),
    "bad:daily-at-text": (
        "report",
        json.dumps({"kind": "daily", "at": "09:00", "on": [], "every": 1, "tz": "UTC"}),
        "{}",
        "{}",
    ),
    "bad:monthly-every-huge": (
        "report",
        json.dumps(
            {"kind": "monthly", "at": ["03:00:00"], "on": [1], "every": 10**30, "tz": "UTC"}
        ),
        "{}",
        "{}",
    ),
    "bad:once-empty": ("report", '{"kind": "once", "at": []}', "{}", "{}"),
    "bad:once-9999": (
        "report",
        '{"kind": "once", "at": ["9999-12-31T00:00:00+00:00"]}',
        "{}",
        "{}",
    ),
    "bad:timeout-1e400": ("report", _every(10**6), "{}", '{"timeout": 1e400}'),
    "bad:grace-1e300": ("report", _every(10**6), "{}", '{"misfire_grace": 1e300}'),
    "bad:timeout-nan": ("report", _every(10**6), "{}", '{"timeout": "NaN"}'),
    "bad:jitter-negative": ("report", _every(10**6), "{}", '{"jitter": -1}'),
    "bad:retries-huge": ("report", _every(10**6), "{}", '{"retries": 1e20}'),
    "bad:start-at-text": ("report", _every(10**6), "{}", '{"start_at": "yesterday"}'),
    "bad:tags-deep": ("report", _every(10**6), "{}", '{"tags": ' + deep(500) + "}"),
    "bad:options-list": ("report", _every(10**6), "{}", "[1]"),
    "bad:task-huge": ("r" * 1_000_000, _every(10**6), "{}", "{}"),
    "bad:\x1b[31mred\x07": ("report", _every(10**6), "{}", "{}"),  # control characters
    "bad:" + "n" * 2000: ("report", _every(10**6), "{}", "{}"),  # a name past MAX_NAME
}
# Good rows: through FleetControl, and one written by hand with odd (valid) Unicode.
ODD = {"note": "\u26a0\ufe0f \u202eevil\u202c \u2028 \U0001d518 \u00e9\u0301", "tenant": 7}


async def hand_write(conn: Any, ledger: LedgerTable, name: str, row: tuple[str, ...]) -> None:
    """Write stored schedule *name* as *row* (task, schedule, kwargs, options), at the
    next revision, as a hand (or a script with write access to the table) would."""
    task, schedule, kwargs, options = row
    await conn.execute(
        f"""INSERT INTO {ledger.schedules} AS s (name, revision, task, schedule, kwargs, options)
            VALUES ($1, (SELECT coalesce(max(revision), 0) + 1 FROM {ledger.schedules}),
                    $2, $3::jsonb, $4::jsonb, $5::jsonb)
            ON CONFLICT (name) DO UPDATE SET revision = EXCLUDED.revision, task = EXCLUDED.task,
                schedule = EXCLUDED.schedule, kwargs = EXCLUDED.kwargs,
                options = EXCLUDED.options""",
        name,
        task,
        schedule,
        kwargs,
        options,
    )


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats every fraction of a second (15 s in production): the operators' views
    show the problems of live members only."""
    monkeypatch.setattr(members, "MEMBERS_EVERY", 0.3)


class Replica:
    """A scheduler with the task ``report`` and its locker; what it started and rejected."""

    def __init__(self, coordination: Coordination, table: str, starts: list[Any]) -> None:
        locker = PostgresLocker(
            coordination.dsn,
            table=table,
            schema=coordination.schema,
            mode=coordination.mode,
            lease=3.0,
        )
        self.scheduler = Scheduler(locker=locker, stop_timeout=0, sync_every=0.5)
        self.rejected: list[ScheduleRejected] = []

        @self.scheduler.task("report")
        async def report(ctx: RunContext, **kwargs: Any) -> None:
            starts.append((ctx.job, ctx.slot, kwargs))

        def rejected(event: Event) -> None:
            assert isinstance(event, ScheduleRejected)
            self.rejected.append(event)

        self.scheduler.subscribe(rejected, ScheduleRejected)


def _trouble(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What cronlock logged at ERROR, or with a traceback."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("cronlock")
        and (record.levelno >= logging.ERROR or record.exc_info)
    ]


async def test_hostile_rows_are_rejected_alone_and_every_reader_answers(
    coordination: Coordination, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cronlock")
    table = f"hostile_{uuid.uuid4().hex[:10]}"
    ledger = coordination.table(table)
    where = ("--dsn", coordination.dsn, "--table", table, *coordination.schema_args)
    starts: list[Any] = []
    replicas = [Replica(coordination, table, starts) for _ in range(2)]
    admin = await asyncpg.connect(coordination.dsn, statement_cache_size=0)
    running: list[Replica] = []
    try:
        async with FleetControl(coordination.dsn, table=table, schema=coordination.schema) as fc:
            await fc.add_schedule("good:every", "report", every(1), kwargs={"tenant": 1})
            await fc.add_schedule("good:cron", "report", cron("* * * * * *", seconds=True))
            await fc.add_schedule("victim", "report", every(1), kwargs={"tenant": 3})
            for name, row in HOSTILE.items():
                await hand_write(admin, ledger, name, row)
            await hand_write(
                admin,
                ledger,
                "good:odd-\u202eunicode\u00e9",
                (
                    "report",
                    _every(10**6),
                    json.dumps(ODD),
                    '{"tags": ["\u00e9t\u00e9"]}',
                ),
            )
            # Problems no cronlock wrote, on a good row: it runs all the same.
            await admin.execute(
                f"UPDATE {ledger.schedules} SET problems = '[1, 2]', problem_revision = revision"
                " WHERE name = 'good:every'"
            )
            for replica in replicas:
                await replica.scheduler.start()  # raises nothing
                running.append(replica)
            await eventually(
                lambda: "victim" in replicas[0].scheduler.stored_jobs, "victim runs", limit=30
            )
            # While they run: a bad row replaces a good one, another bad row is added, and
            # a good schedule added after both still reaches the replicas.
            await hand_write(admin, ledger, "victim", HOSTILE["bad:micros-1e20"])
            await hand_write(admin, ledger, "bad:late", HOSTILE["bad:kwargs-1000-deep"])
            await fc.add_schedule("good:late", "report", every(1), kwargs={"tenant": 2})
            good = {"good:every", "good:cron", "good:late", "good:odd-\u202eunicode\u00e9"}
            await eventually(
                lambda: all(good <= set(r.scheduler.stored_jobs) for r in replicas),
                "good jobs applied",
                limit=30,
            )

            def ran(job: str) -> int:
                return len({slot for name, slot, _ in starts if name == job})

            await eventually(lambda: all(ran(job) >= 3 for job in good), "good slots ran", limit=30)
            bad = {*HOSTILE, "victim", "bad:late"}
            await eventually(
                lambda: all({e.schedule for e in r.rejected} >= bad for r in replicas),
                "every replica rejects every bad row",
                limit=30,
            )
            listed: dict[str, Any] = {}

            async def all_rejected() -> bool:
                listed.update({s.name: s for s in await fc.schedules()})
                return all(listed[name].rejected for name in bad)

            # A liveness bound only: each replica's problem reports reach the ledger with its
            # next sync, which a machine busy with CI's coverage run can delay well past 30 s.
            deadline = time.monotonic() + 90
            while not await all_rejected() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            status = await cli("status", *where)
            history = await cli("history", "good:every", *where)
            listing = await cli("schedules", "list", *where)
            async with client(
                cronlock.web.app(coordination.dsn, table=table, schema=coordination.schema)
            ) as browser:
                page = await browser.get("/schedules")
                front = await browser.get("/")
            await asyncio.sleep(1.5)  # three more syncs: nothing said twice
    finally:
        for replica in running:
            await replica.scheduler.shutdown()
        await admin.close()

    # The good schedules ran, each slot once in the fleet, with their kwargs.
    assert max(Counter((job, slot) for job, slot, _ in starts).values()) == 1
    assert {json.dumps(k, sort_keys=True) for j, _, k in starts if j.startswith("good:odd")} == {
        json.dumps(ODD, sort_keys=True)
    }
    assert not [job for job, _, _ in starts if job in bad and job != "victim"]
    assert "victim" not in replicas[0].scheduler.stored_jobs  # its bad revision dropped it
    # Each bad row rejected alone: once per revision on each replica, a WARNING each time.
    for replica in replicas:
        said = Counter(e.schedule for e in replica.rejected)
        assert set(said) == bad and set(said.values()) == {1}, said
    for name in bad:
        warned = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and f"stored schedule {shown(name)} " in r.getMessage()
        ]
        assert len(warned) == 2, (name, len(warned))
    assert not _trouble(caplog)
    assert "OverflowError" in next(
        e.reason for e in replicas[0].rejected if e.schedule == "bad:micros-1e20"
    )
    # The operators see every row, the bad ones unreadable and rejected by both replicas.
    assert set(listed) == bad | good
    for name in bad:
        assert listed[name].problem is not None and listed[name].rejected, {
            n: (s.problems, s.rejected) for n, s in listed.items()
        }
        assert len(listed[name].problems) == 2 and len(listed[name].problem or "") < 2_000
    assert listed["bad:micros-1e20"].unreadable is not None
    assert listed["good:every"].problems == {} and not listed["good:every"].rejected
    for done in (status, history, listing):
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "good:every" in history.stdout
    assert "bad:micros-1e20" in listing.stdout and "unreadable" in listing.stdout
    assert "OverflowError" in listing.stdout
    assert page.status_code == 200 and front.status_code == 200
    assert 'data-schedule="bad:micros-1e20"' in page.text
    assert "RecursionError" in page.text  # bad:kwargs-1000-deep's reason
