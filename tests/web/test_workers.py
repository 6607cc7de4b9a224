"""The dashboard's actions under a real multi-worker server (issue 23, item 3).

``uvicorn --workers 3`` serves the dashboard on one port, each worker with the default
CSRF key. A browser loads a page from one worker and posts its forms, each on a fresh
connection, so they land on the other workers too: every action must be accepted (the
key is the fleet's, kept in the ledger) and done in the ledger.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from cronlock.postgres import FleetControl

from ..multiworker import get, uvicorn_workers
from .seed import seed, table_name

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKERS = 3
VERBS = ("pause", "resume", "trigger")
POSTS = 600  # a liveness bound: the posts go on until every worker has accepted every verb


@pytest.fixture
async def served(pg_dsn: str) -> AsyncIterator[tuple[str, str]]:
    """(base URL, ledger table) of a 3-worker uvicorn serving the dashboard."""
    table = table_name()
    await seed(pg_dsn, table, notes=[("nightly", "every 1h", None)], runs=[])
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table}
    try:
        async with uvicorn_workers(
            "tests.web.workers_app:app", env, workers=WORKERS, probe="/api/jobs"
        ) as (base, _):
            yield base, table
    finally:
        conn = await asyncpg.connect(pg_dsn)
        try:
            for suffix in (
                "",
                "_jobs",
                "_control",
                "_leases",
                "_members",
                "_secrets",
                "_definitions",
            ):
                await conn.execute(f'DROP TABLE IF EXISTS "{table}{suffix}"')
        finally:
            await conn.close()


async def _post(base: str, path: str, **options: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base) as fresh:
        return await fresh.post(path, **options)


async def test_every_action_is_accepted_by_every_worker(
    pg_dsn: str, served: tuple[str, str]
) -> None:
    base, table = served
    page = await get(base, "/")
    assert page.status_code == 200, page.text
    cookie = page.cookies["cronlock_csrf"]
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, "no CSRF token on the page"
    form = {"job": "nightly", "csrf": found.group(1)}
    served_by: dict[str, int] = {}
    accepted: dict[str, set[str]] = {verb: set() for verb in VERBS}  # verb: worker pids
    refused: list[str] = []
    expected: frozenset[str] = frozenset()
    posts = 0
    async with FleetControl(pg_dsn, table=table) as control:
        while any(len(pids) < WORKERS for pids in accepted.values()):
            assert posts < POSTS, f"{POSTS} posts, and not every worker took every verb: {accepted}"
            verb = VERBS[posts % len(VERBS)]
            posts += 1
            done = await _post(
                base,
                f"/actions/{verb}",
                data=form,
                headers={"cookie": f"cronlock_csrf={cookie}", "origin": base},
            )
            pid = done.headers["x-worker-pid"]
            served_by[pid] = served_by.get(pid, 0) + 1
            if done.status_code != 303:
                refused.append(f"{verb} on worker {pid}: {done.status_code} {done.text[:200]}")
                break
            accepted[verb].add(pid)
            if verb != "trigger":
                expected = frozenset({"nightly"}) if verb == "pause" else frozenset()
            # Done in the ledger, as FleetControl sees it.
            assert await control.paused() == expected, (posts, verb)
    print(
        f"[measured] page from worker {page.headers['x-worker-pid']}, posts by worker: "
        f"{served_by}, refused {len(refused)} of {posts}"
    )
    assert refused == []
    assert len(served_by) == WORKERS  # so the page's worker was not the only one
    conn = await asyncpg.connect(pg_dsn)
    try:
        triggered = await conn.fetchval(
            f'SELECT trigger_slot IS NOT NULL FROM "{table}_control" WHERE job = $1', "nightly"
        )
        [key] = await conn.fetch(f'SELECT name, value FROM "{table}_secrets"')
    finally:
        await conn.close()
    assert triggered
    assert key["name"] == "web.csrf" and len(key["value"]) == 32  # one key for the fleet
    assert key["value"].hex() not in page.text  # never shown
