"""The CSRF checks of a real dashboard server (issue 24, item 6): only cookies the
dashboard made are given tokens, the Origin's scheme counts, and a POST that says
nothing of where it comes from is refused (a same-origin Referer stands in for Origin)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from .realserver import Served, served
from .seed import seed, table_name
from .test_limits import drop

# One worker runs them all (pytest -n), on one server: each test is its own client (its
# own cookie jar), and only a refused pause and triggers are posted, which no test reads.
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("web-csrf")]

CHOSEN = "attacker-chosen-cookie-value-0123456789abcdef"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(pg_dsn: str) -> AsyncIterator[Served]:
    table = table_name()
    await seed(pg_dsn, table, notes=[("nightly", "every 1h", None)], runs=[])
    env = {"CRONLOCK_WEB_DSN": pg_dsn, "CRONLOCK_WEB_TABLE": table, "CRONLOCK_WEB_MODE": "actions"}
    try:
        async with served(env) as running:
            yield running
    finally:
        await drop(pg_dsn, table)


def _token(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


async def test_a_client_chosen_cookie_gets_no_token(server: Served) -> None:
    """Fixation: whoever planted a cookie in the victim's browser loads the page with the
    same cookie, to learn its token. The dashboard replaces the cookie instead, and a form
    posted with the planted cookie and that page's token is refused."""
    async with httpx.AsyncClient(base_url=server.base) as attacker:
        attacker.cookies.set("cronlock_csrf", CHOSEN)
        page = await attacker.get("/")
        issued = page.cookies.get("cronlock_csrf")
        token = _token(page)
    assert issued is not None and issued != CHOSEN  # replaced, not adopted
    headers = {"cookie": f"cronlock_csrf={CHOSEN}", "origin": server.base, "x-operator": "v"}
    async with httpx.AsyncClient(base_url=server.base) as victim:
        forged = await victim.post(
            "/actions/pause", data={"job": "nightly", "csrf": token}, headers=headers
        )
    assert forged.status_code == 403, forged.text[:300]
    assert "was not made by this dashboard" in forged.text


@pytest.mark.parametrize(
    ("said", "status"),
    [
        ({"origin": "{base}"}, 303),
        ({"referer": "{base}/jobs/nightly"}, 303),  # no Origin: the Referer says it
        ({"origin": "{other_scheme}"}, 403),  # https:// of the same host and port
        ({"referer": "{other_scheme}/jobs/nightly"}, 403),
        ({"referer": "http://evil.example/"}, 403),
        ({}, 403),  # neither
    ],
    ids=["origin", "referer", "other-scheme", "referer-other-scheme", "referer-other", "neither"],
)
async def test_where_a_post_comes_from(server: Served, said: dict[str, str], status: int) -> None:
    other_scheme = server.base.replace("http://", "https://")
    headers = {k: v.format(base=server.base, other_scheme=other_scheme) for k, v in said.items()}
    async with httpx.AsyncClient(base_url=server.base) as browser:
        form = {"job": "nightly", "csrf": _token(await browser.get("/"))}
        done = await browser.post(
            "/actions/trigger", data=form, headers={**headers, "x-operator": "ops"}
        )
    assert done.status_code == status, done.text[:300]
