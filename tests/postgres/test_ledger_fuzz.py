"""Random odd rows in a real ledger while a replica runs (issue 24): it keeps running its
healthy job every slot, a trigger still reaches it, the command line's status and
history read the ledger without a traceback, and the dashboard (a real server) answers
every page and API read; each of them reports the rows it cannot read.

The rows come from a seeded generator (the seed is in the test's name: a failure replays):
timestamps at and past the edges of what Python holds, huge and odd text (no NUL: the
server refuses it), outcomes cronlock never writes, extreme numbers, and NULLs where the
tables allow them. They go into the runs, jobs and control tables, in waves, while the
replica runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from cronlock import Scheduler, daily, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import fleetwatch as control_module
from cronlock.postgres._sql.runs import skipped
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from ..web.realserver import served
from .test_cli_pg import cli, cli_here

pytestmark = pytest.mark.postgres

_TIMES = [
    "4713-01-01 BC",
    "0001-01-01 00:00:00+00",
    "0001-01-01 12:00:00-14",
    "0001-01-02 00:00:01+00",
    "1970-01-01 00:00:00+00",
    "2000-02-29 12:00:00+00",
    "9999-12-30 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    "10000-01-01 00:00:00+00",
    "294276-12-31 23:59:59+00",
    "infinity",
    "-infinity",
]
_TEXTS = [
    "",
    " ",
    "\u202eevil\u202c",  # right-to-left override
    "e\u0301\u0301\u0301",  # combining accents
    "\U0001f4a5" * 50,
    "\x01\x07\x1b[31mred\x1b[0m",  # control characters, an ANSI escape
    "line\nbreak\r\n\ttab",
    "<script>alert(1)</script>",
    "'; DROP TABLE x; --",
    "\ufeff\u200b\u2028\u2029",
    "\U0010ffff",  # the last code point
]
_OUTCOMES = [None, "succeeded", "failed", "crashed", "weird", "SUCCEEDED", "", "\U0001f600"]


def _time(rng: random.Random, nullable: bool = False) -> str | None:
    roll = rng.random()
    if nullable and roll < 0.15:
        return None
    if roll < 0.3:
        return f"{rng.randint(1990, 2090)}-{rng.randint(1, 12):02}-{rng.randint(1, 28):02} 00:00+00"
    return rng.choice(_TIMES)


def _text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.05:
        return "x" * (2 * 1024 * 1024)  # 2 MiB
    if roll < 0.4:
        return "".join(chr(rng.choice([rng.randint(1, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))
                       for _ in range(rng.randint(1, 40)))  # fmt: skip
    return rng.choice(_TEXTS)


async def _wave(admin: Any, ledger: LedgerTable, rng: random.Random, jobs: list[str]) -> None:
    """Odd rows of *jobs* in the runs and jobs tables, and of all but the first (whose pause
    would stop it, as it should) in the control table."""
    for _ in range(12):
        job = rng.choice(jobs)
        await admin.execute(
            f"""INSERT INTO {ledger.runs} (job, slot, host, pid, session, started_at,
                                            finished_at, outcome, error, attempt, manual)
                VALUES ($1, $2::text::timestamptz, $3, $4, $5, $6::text::timestamptz,
                        $7::text::timestamptz, $8, $9, $10, $11)
                ON CONFLICT DO NOTHING""",
            job,
            _time(rng),
            _text(rng),
            rng.choice([0, -1, 2**31 - 1, -(2**31), 4242]),
            rng.choice([None, 2**31 - 1, 0]),
            _time(rng),
            _time(rng, nullable=True),
            rng.choice(_OUTCOMES),
            rng.choice([None, _text(rng)]),
            rng.choice([1, 2, 32767, -32768, 0]),
            rng.random() < 0.3,
        )
    for _ in range(4):
        await admin.execute(
            f"""INSERT INTO {ledger.jobs} AS j (job, schedule, next_run, updated_at,
                                                 updated_by, grace, due, grace_until)
                VALUES ($1, $2, $3::text::timestamptz, coalesce($4::text::timestamptz, now()),
                        $5, $6::text::float8, $7::text::timestamptz, $8::text::timestamptz)
                ON CONFLICT (job) DO UPDATE SET next_run = EXCLUDED.next_run,
                    due = EXCLUDED.due, grace = EXCLUDED.grace, schedule = EXCLUDED.schedule""",
            rng.choice(jobs),
            _text(rng),
            _time(rng, nullable=True),
            _time(rng, nullable=True),
            rng.choice([None, _text(rng)]),
            rng.choice([None, "NaN", "Infinity", "-Infinity", "-1", "1e308", "0"]),
            _time(rng, nullable=True),
            _time(rng, nullable=True),
        )
        await admin.execute(
            f"""INSERT INTO {ledger.control} AS c (job, paused_at, paused_by, trigger_slot,
                                                    triggered_by)
                VALUES ($1, $2::text::timestamptz, $3, $4::text::timestamptz, $5)
                ON CONFLICT (job) DO UPDATE SET trigger_slot = EXCLUDED.trigger_slot,
                    paused_at = EXCLUDED.paused_at""",
            rng.choice(jobs[1:]),
            _time(rng, nullable=True),
            rng.choice([None, _text(rng)]),
            _time(rng, nullable=True),
            rng.choice([None, _text(rng)]),
        )


def _traceback_free(result: Any) -> None:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode in (0, 1), (result.returncode, result.stderr[-3000:])


@pytest.mark.parametrize("seed", [24, 2024])
async def test_random_odd_rows_never_stop_the_replica_or_the_cli(
    pool: Any,
    admin: Any,
    pg_dsn: str,
    seed: int,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(control_module, "RUNS_EVERY", 0.3)
    monkeypatch.setattr(control_module, "POLL_EVERY", 0.2)  # triggers, and the reads' turn
    caplog.set_level(logging.WARNING, logger="cronlock")
    rng = random.Random(seed)
    ledger = LedgerTable(f"fuzz_{uuid.uuid4().hex[:10]}")
    odd = ["odd", "\u202eodd\u202c", "e\u0301", "\U0001f4a5", "tab\there"]
    ran: list[int] = []
    scheduler = Scheduler(locker=PostgresLocker(pool, table=ledger.table, sessions=1))
    scheduler.add_job(lambda: ran.append(1), every(seconds=0.25), name="healthy")
    scheduler.add_job(lambda: None, daily("03:00"), name="on-demand")  # run by a trigger
    for name in odd[:2]:  # odd jobs this replica runs too: their rows are read back
        scheduler.add_job(lambda: None, every(seconds=0.25), name=name)

    def runs_past(n: int) -> Callable[[], bool]:
        return lambda: len(ran) >= n

    async with scheduler:
        await eventually(runs_past(2), "two runs of the healthy job")
        for wave in range(3):
            await _wave(admin, ledger, rng, ["healthy", *odd])
            # It keeps running every slot, the odd rows in its ledger.
            await eventually(runs_past(len(ran) + 4), f"4 more runs after wave {wave + 1}")
        async with FleetControl(pool, table=ledger.table) as control:  # triggers still work
            triggered = await control.trigger("on-demand", force=True)
            assert (await triggered.wait(timeout=10)).outcome == "succeeded"
        await asyncio.sleep(0.5)
    real = await admin.fetchval(
        f"""SELECT count(*) FROM {ledger.runs}
            WHERE job = 'healthy' AND pid = $1 AND outcome = 'succeeded'""",
        os.getpid(),  # the generator's rows have other pids
    )
    assert real == len(ran)  # once a slot, every run recorded
    trouble = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("cronlock") and (r.levelno >= logging.ERROR or r.exc_info)
    ]
    assert trouble == []
    # The odd rows were reported: counted, and named at WARNING, by the replica.
    assert skipped(ledger.runs) > 0
    assert any(
        "cannot read" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )
    table = ["--dsn", pg_dsn, "--table", ledger.table]
    told = ""
    # The first in a process of its own: a process tells each odd row once, and this one's
    # replica told them already; the others here, their main() (no traceback, no crash).
    for i, args in enumerate(
        (["status", "--check"], ["status"], *(["history", job] for job in odd[:3]))
    ):
        result = await (cli if i == 0 else cli_here)(*args, *table)
        _traceback_free(result)
        told += result.stderr
    assert "cannot read" in told  # and by the command line, on stderr
    # The dashboard, a real server, answers every page and API read (its log: no traceback).
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": ledger.table}
    async with served(env) as web, httpx.AsyncClient(base_url=web.base) as client:
        paths = ["/", "/api/jobs"]
        for job in ["healthy", *odd]:
            paths += [f"/jobs/{quote(job, safe='')}", f"/api/jobs/{quote(job, safe='')}/runs"]
        for path in paths:
            answer = await client.get(path)
            assert answer.status_code == 200, (path, answer.text[:500])
        assert "cannot read" in web.log.read_text()  # and by the dashboard, in its log
