"""The simulated server's answers to the operators' reads agree with PostgreSQL's: what
``python -m cronlock status`` sends (the jobs, their conflicts, the lock holders, the
paused jobs, the stored schedules, the catalog probes).

The same rows in a real ledger (a throwaway schema) and in a simulated server, the real
statement with asyncpg and the handler with the same arguments, the answers compared (the
harness of ``test_statements_upkeep.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock._sim.server import Exec
from cronlock.postgres._sql import control, definitions, fleet, schema, stored

from .realserver import throwaway_ledger
from .test_statements_upkeep import Pair

pytestmark = pytest.mark.postgres

S = timedelta(seconds=1)
ODD = datetime(1, 1, 1, 12, tzinfo=UTC)
"""An instant before the earliest a replica reads (``_sql/runs.LOW``)."""


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with throwaway_ledger("agree_fleet") as (table, (a, b)):
        yield Pair(table, a, b)


async def test_catalog_probes_find_the_ledgers_tables(pair: Pair) -> None:
    t = pair.table
    missing = f'{t.quoted_schema}."nothing_here"'
    assert await pair.agree(schema.TABLE_EXISTS_SQL, t.schedules) == [{"?column?": True}]
    assert await pair.agree(schema.TABLE_EXISTS_SQL, missing) == [{"?column?": False}]
    await pair.agree(schema.TABLE_EXISTS_SQL, None)
    for names in ((t.members, t.definitions), (missing, t.definitions), (t.leases, missing)):
        # Two columns of one name: read by position (the library reads them so).
        real = await pair.a.fetchrow(schema.TABLES_EXIST_SQL, *names)
        handler = pair.server.statements.lookup(schema.TABLES_EXIST_SQL)
        sim = handler(Exec(pair.server, pair.sa), names)
        assert tuple(real) == tuple(sim[0])
    await pair.agree(schema.READABLE_TABLE_SQL, t.secrets, t.leases)
    await pair.agree(schema.READABLE_TABLE_SQL, missing, t.leases)
    await pair.agree(schema.READABLE_TABLE_SQL, t.secrets, missing)


async def _jobs_and_runs(pair: Pair) -> None:
    t = pair.base
    await pair.put("jobs", job="noted", next_run=t + 5 * S, grace=10.0, due=t, tags=["b", "a"])
    await pair.put("jobs", job="ran-too", next_run=t + 5 * S, grace=None, due=None)
    await pair.put("runs", job="ran-too", slot=t - 5 * S, finished_at=t, outcome="succeeded")
    await pair.put("runs", job="runs-only", slot=t - 5 * S)
    await pair.put("jobs", job="retired", next_run=t, retired_at=t, retired_by="op")
    await pair.put("runs", job="retired", slot=t - 5 * S, finished_at=t, outcome="failed")
    await pair.put("jobs", job="odd", next_run=ODD, due=ODD, grace=5.0, updated_at=ODD)


async def test_jobs_are_the_notes_and_the_runs_but_the_retired(pair: Pair) -> None:
    await _jobs_and_runs(pair)
    answer = await pair.agree(fleet.jobs_sql(pair.table))
    assert sorted(row["job"] for row in answer) == ["noted", "odd", "ran-too", "runs-only"]
    odd = next(row for row in answer if row["job"] == "odd")
    assert odd["next_run"] is None and "next_run=0001-01-01 12:00:00+00" in odd["odd"]


async def test_jobs_of_an_empty_ledger(pair: Pair) -> None:
    assert await pair.agree(fleet.jobs_sql(pair.table)) == []


async def test_named_jobs_are_those_the_ledger_knows(pair: Pair) -> None:
    await _jobs_and_runs(pair)
    names = ["runs-only", "noted", "nobody", "noted", "retired", "odd"]
    answer = await pair.agree(fleet.named_jobs_sql(pair.table), names)
    assert sorted(row["job"] for row in answer) == ["noted", "noted", "odd", "runs-only"]
    assert await pair.agree(fleet.named_jobs_sql(pair.table), []) == []


async def test_conflicts_are_live_replicas_that_disagree(pair: Pair) -> None:
    t = pair.base
    for holder, expires in (("r1", t + 30 * S), ("r2", t + 30 * S), ("gone", t - S)):
        await pair.put("members", holder=holder, expires_at=expires)
    await pair.put("definitions", job="same", holder="r1", definition="d")
    await pair.put("definitions", job="same", holder="r2", definition="d")
    await pair.put("definitions", job="differ", holder="r1", definition="d1")
    await pair.put("definitions", job="differ", holder="r2", definition="d2")
    await pair.put("definitions", job="dead-differs", holder="r1", definition="d1")
    await pair.put("definitions", job="dead-differs", holder="gone", definition="d2")
    await pair.put("definitions", job="nobody-lives", holder="ghost", definition="d3")
    answer = await pair.agree(definitions.conflicted_sql(pair.table))
    assert answer == [{"job": "differ", "writers": 2}]
    named = definitions.conflicted_sql(pair.table, named=True)
    assert await pair.agree(named, ["differ", "same"]) == answer
    assert await pair.agree(named, ["same", "dead-differs"]) == []


async def test_paused_jobs_by_name(pair: Pair) -> None:
    t = pair.base
    await pair.put("control", job="b", paused_at=t, paused_by="op")
    await pair.put("control", job="a", paused_at=t, paused_by="op")
    await pair.put("control", job="triggered", trigger_slot=t, triggered_by="op")
    assert await pair.agree(control.paused_sql(pair.table)) == [{"job": "a"}, {"job": "b"}]


async def test_lock_holders_name_their_sessions(pair: Pair) -> None:
    await pair.a.execute("SELECT set_config('application_name', 'sim:op', false)")
    pair.sa.application_name = "sim:op"
    await pair.lock(pair.table.lock_key("held"), "a")
    await pair.lock(pair.table.lock_key("other"), "b")
    await pair.lock(-5, "b")
    real, sim = await pair.run(fleet.HOLDERS_SQL)

    def ours(answer: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        # Every test's locks are in one database: ours only; no address or start kept.
        return sorted(
            (r["key"], r["pid"], r["application_name"]) for r in answer if r["key"] in pair.keys
        )

    assert ours(real) == ours(sim)
    assert len(ours(sim)) == 3


async def test_stored_schedules_list_with_their_live_problems(pair: Pair) -> None:
    t = pair.base
    for holder, expires in (("r1", t + 30 * S), ("r2", t + 30 * S), ("gone", t - S)):
        await pair.put("members", holder=holder, expires_at=expires)
    put = pair.put
    await put("schedules", name="", revision=0, removed=True, task="")  # the lock row
    await put("schedules", name="clean", schedule={"every": 5}, kwargs={"x": [1, "a"]})
    await put("schedules", name="one-live", problems={"r1": "no task", "gone": "x"},
              problem_revision=1)  # fmt: skip
    await put("schedules", name="dead-only", problems={"gone": "no task"}, problem_revision=1)
    await put("schedules", name="rejected", problems={"r1": "no task", "r2": "bad kwargs"},
              problem_revision=1)  # fmt: skip
    await put("schedules", name="old-problem", revision=2, problems={"r1": "a", "r2": "b"},
              problem_revision=1)  # fmt: skip
    await put("schedules", name="odd-problems", problems=["not", "an object"], problem_revision=1)
    await put("schedules", name="removed", removed=True, revision=3)
    await put("control", job="clean", paused_at=t, paused_by="op")
    answer = await pair.agree(stored.list_schedules_sql(pair.table))
    assert [row["name"] for row in answer if row["rejected"]] == ["rejected"]
    assert len(answer) == 6  # not the tombstones


async def test_stored_schedules_with_no_live_member(pair: Pair) -> None:
    await pair.put("members", holder="gone", expires_at=pair.base - S)
    await pair.put("schedules", name="s", problems={"gone": "no task"}, problem_revision=1)
    answer = await pair.agree(stored.list_schedules_sql(pair.table))
    assert [(row["problems"], row["rejected"]) for row in answer] == [(None, False)]
