"""What one anonymous client can make a real dashboard server hold (issue 24): a huge
action body is refused before it is read, whatever the dashboard's mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from .realserver import Served, served
from .seed import seed, table_name

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

MIB = 1024 * 1024
HUGE = 64 * MIB
CHUNK = 64 * 1024


async def drop(dsn: str, table: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for suffix in ("", "_jobs", "_control", "_leases", "_members", "_secrets", "_definitions"):
            await conn.execute(f'DROP TABLE IF EXISTS "{table}{suffix}"')
    finally:
        await conn.close()


@pytest.fixture(params=["read-only", "actions"])
async def server(request: pytest.FixtureRequest, pg_dsn: str) -> AsyncIterator[tuple[Served, str]]:
    """(the server, its mode)."""
    table = table_name()
    await seed(pg_dsn, table, notes=[("nightly", "every 1h", None)], runs=[])
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table}
    try:
        async with served({**env, "CRONLOCK_WEB_MODE": request.param}) as running:
            yield running, request.param
    finally:
        await drop(pg_dsn, table)


async def post_lazily(server: Served, *, chunked: bool) -> tuple[str, int]:
    """POST a body of :data:`HUGE` bytes, made as it is sent, to /actions/pause, until the
    server answers or stops reading: (its status line, the bytes the client got to send)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {HUGE}"
    writer.write(
        f"POST /actions/pause HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\n{framing}\r\n\r\n".encode()
    )
    answer = asyncio.ensure_future(reader.readline())
    piece = b"job=" + b"a" * (CHUNK - 4)
    frame = f"{CHUNK:x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    sent = 0
    try:
        while sent < HUGE and not answer.done():
            writer.write(frame)
            drained = asyncio.ensure_future(writer.drain())
            await asyncio.wait({drained, answer}, timeout=30, return_when="FIRST_COMPLETED")
            if not drained.done():  # the server stopped reading: it answered, or will
                drained.cancel()
                break
            drained.result()
            sent += CHUNK
        if sent >= HUGE and chunked:
            writer.write(b"0\r\n\r\n")
    except (ConnectionResetError, BrokenPipeError):
        pass  # the server closed the connection: what it answered is still readable
    status = (await asyncio.wait_for(answer, 30)).decode().strip()
    writer.close()
    return status, sent


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
async def test_a_huge_action_body_is_refused_before_it_is_read(
    server: tuple[Served, str], chunked: bool
) -> None:
    running, mode = server
    peak = running.memory()
    status, sent = await post_lazily(running, chunked=chunked)
    grown = running.memory() - peak
    print(f"[measured] {status!r} after {sent / MIB:.1f} MiB sent, peak RSS +{grown / MIB:.1f} MiB")
    # A read-only dashboard refuses every action at once; else the form is too large.
    assert status.split()[1] == ("403" if mode == "read-only" else "413"), status
    assert sent < HUGE / 4, f"the server read {sent / MIB:.1f} MiB of the body before answering"
    assert grown < 8 * MIB


BURST = 25
BOUND = 4  # web.app's default max_connections


async def test_a_burst_of_requests_opens_at_most_max_connections(pg_dsn: str) -> None:
    """25 anonymous GETs at once to a dashboard given a DSN: the server's sessions of
    the dashboard (by its application_name), polled through the burst, stay within 4."""
    table = table_name()
    await seed(pg_dsn, table, notes=[(f"job-{i}", "every 1h", None) for i in range(10)], runs=[])
    name = f"cronlock-web-{table}"
    sep = "&" if "?" in pg_dsn else "?"
    env = {
        "CRONLOCK_WEB_DSN": f"{pg_dsn}{sep}application_name={name}",
        "CRONLOCK_WEB_TABLE": table,
    }
    watcher = await asyncpg.connect(pg_dsn)
    try:
        async with served(env) as running, httpx.AsyncClient(base_url=running.base) as client:
            seen: list[int] = []

            async def burst() -> list[int]:
                answers = await asyncio.gather(*(client.get("/") for _ in range(BURST)))
                return [answer.status_code for answer in answers]

            requests = asyncio.ensure_future(burst())
            while not requests.done():
                seen.append(
                    await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
                    )
                )
            statuses = await requests
        print(f"[measured] dashboard sessions during the burst: at most {max(seen)}")
        assert statuses == [200] * BURST
        assert 1 <= max(seen) <= BOUND, seen
    finally:
        await watcher.close()
        await drop(pg_dsn, table)


ERRORS = 40
ERROR_BYTES = 2 * MIB


async def test_long_errors_are_fetched_as_a_prefix(pg_dsn: str) -> None:
    """40 runs with a 2 MiB error each: a page of them grows the server's peak RSS by a
    few MiB, not by the 80 MiB of their texts; the cut first line is marked truncated."""
    table = table_name()
    await seed(pg_dsn, table, notes=[("noisy", "every 1h", None)], runs=[])
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f'INSERT INTO "{table}" (job, slot, host, pid, started_at, finished_at, outcome, '
            "error) SELECT 'noisy', s, 'h', 1, s, s, 'failed', repeat('E', $1) "
            "FROM generate_series(now() - interval '1 hour' * ($2 - 1), now(), '1 hour') s",
            ERROR_BYTES,
            ERRORS,
        )
    finally:
        await conn.close()
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table}
    try:
        async with served(env) as running, httpx.AsyncClient(base_url=running.base) as client:
            assert (await client.get("/api/jobs")).status_code == 200  # warmed up
            peak = running.memory()
            api = await client.get("/api/jobs/noisy/runs?limit=100")
            page = await client.get("/jobs/noisy?limit=100")
            grown = running.memory() - peak
        print(
            f"[measured] {ERRORS} runs of {ERROR_BYTES // MIB} MiB errors: +{grown / MIB:.1f} MiB"
        )
        runs = api.json()["runs"]
        assert len(runs) == ERRORS
        assert all(run["error_truncated"] and run["error"] == "E" * 300 for run in runs)
        assert page.status_code == 200 and page.text.count("(truncated)") == ERRORS + 1
        assert grown < 16 * MIB
    finally:
        await drop(pg_dsn, table)


BAD_QUERIES = [
    "limit=%C2%B2",  # "²": str.isdigit() says yes, int() says no
    "limit=%EF%BC%95",  # a fullwidth 5
    "limit=0",
    "limit=99999999999999999999",
    "before=0001-01-01T00:00:00%2B01:00",  # year 0 in UTC
    "before=9999-12-31T23:00:00-05:00",  # year 10000 in UTC
    "before=yesterday",
    "before=2026-01-01T00:00:00",  # no offset
]


async def test_bad_query_parameters_are_a_400_with_the_headers(pg_dsn: str) -> None:
    table = table_name()
    await seed(pg_dsn, table, notes=[("nightly", "every 1h", None)], runs=[])
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table}
    try:
        async with served(env) as running, httpx.AsyncClient(base_url=running.base) as client:
            for query in BAD_QUERIES:
                for path in ("/jobs/nightly", "/api/jobs/nightly/runs"):
                    answer = await client.get(f"{path}?{query}")
                    assert answer.status_code == 400, (path, query, answer.text[:300])
                    assert answer.headers["x-content-type-options"] == "nosniff"
                    assert "content-security-policy" in answer.headers
    finally:
        await drop(pg_dsn, table)
