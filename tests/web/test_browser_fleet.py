"""The job list of a fleet of thousands as a person uses it: real headless Chromium against a
real dashboard server, a ledger of 3,000 jobs (every tenth failing, every hundredth
overdue, each tagged with its team). The summary counts every job, a filter by name or tag
finds the one job, a status count lists those jobs, and the pages move.

Without the browser these tests skip, loudly; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from .seed import table_name
from .test_browser import Fleet, browser, wait_for
from .test_scale import seed_fleet

__all__ = ("browser",)  # the module's browser fixture, shared with test_browser

# One worker runs them all (pytest -n): one seeded ledger, one server, one browser. They
# only read, so their order does not matter; the group only saves seeding it again.
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("browser-fleet")]

JOBS = 3000
NEEDLE = "job-01234"  # the one job tagged "needle"


@pytest.fixture(scope="module")
def fleet(pg_dsn: str, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """3,000 jobs in a ledger of their own, and the dashboard server on it; the browser
    starts while the server does. Nothing here changes the ledger: the tests share it."""
    fleet = Fleet(pg_dsn, table_name())

    async def seed() -> None:
        await seed_fleet(pg_dsn, fleet.table, JOBS)
        conn: Any = await asyncpg.connect(pg_dsn)
        try:
            jobs = f'"{fleet.table}_jobs"'
            await conn.execute(f"UPDATE {jobs} SET tags = ARRAY['team-' || right(job, 1)]")
            await conn.execute(
                f"UPDATE {jobs} SET tags = tags || 'needle'::text WHERE job = $1", NEEDLE
            )
        finally:
            await conn.close()

    asyncio.run(seed())
    try:
        fleet.server()
        request.getfixturevalue("browser")  # or the loud skip (CI: failure) without one
        fleet.ready()
        yield fleet
    finally:
        fleet.close()


def counts(browser: Any) -> dict[str, str]:
    """The summary's counts as shown, by status (read at once: the live update every
    second replaces the elements)."""
    script = """return Array.from(document.querySelectorAll('p.summary a.count'))
                       .map(a => [a.dataset.count, a.textContent])"""
    return {str(status): str(text) for status, text in browser.execute_script(script)}


def listed(browser: Any) -> list[tuple[str, str]]:
    """The rows shown, (job, status) each, in order (read at once)."""
    script = """return Array.from(document.querySelectorAll('tr.job'))
                       .map(row => [row.dataset.job, row.dataset.status])"""
    return [(job, status) for job, status in browser.execute_script(script)]


def names(browser: Any) -> list[str]:
    return [job for job, _ in listed(browser)]


def where(browser: Any) -> str:
    """The line that says which rows and page are shown."""
    script = "const p = document.querySelector('p.asof'); return p ? p.textContent : '';"
    return str(browser.execute_script(script))


def test_the_summary_counts_every_job(fleet: Fleet, browser: Any) -> None:
    browser.get(fleet.url + "/")
    shown = wait_for(lambda: counts(browser) if len(counts(browser)) == 9 else {}, "counts")
    assert shown == {
        "paused": "0 paused",
        "conflict": "0 conflict",
        "rejected": "0 rejected",
        "absent": "0 absent",
        "overdue": "30 overdue",
        "failing": "270 failing",
        "running": "0 running",
        "ok": "2700 ok",
        "new": "0 new",
    }
    total = browser.execute_script("return document.querySelector('p.summary').dataset.total")
    assert total == str(JOBS)
    first = wait_for(lambda: listed(browser), "the first page's rows")
    assert len(first) == 100  # one page, failing and overdue first
    assert {status for _, status in first} == {"overdue", "failing"}
    assert "showing 100 of 3000 matching · page 1 of 30" in where(browser)


def click(browser: Any, selector: str) -> None:
    """Click what *selector* finds (found again if the live update replaced it)."""
    from selenium.webdriver.common.by import By

    def clicked() -> bool:
        browser.find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait_for(clicked, selector)


def test_a_count_lists_the_jobs_it_counts(fleet: Fleet, browser: Any) -> None:
    browser.get(fleet.url + "/")
    click(browser, 'p.summary a.count[data-count="overdue"]')
    wait_for(lambda: "status=overdue" in browser.current_url, "the overdue jobs' URL")
    shown = wait_for(lambda: listed(browser) if len(listed(browser)) == 30 else [], "30 rows")
    assert {status for _, status in shown} == {"overdue"}


def test_filtering_by_name_finds_one_job(fleet: Fleet, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(fleet.url + "/")
    box = wait_for(lambda: browser.find_element(By.NAME, "q"), "the name filter")
    box.send_keys("JOB-02345")  # any case
    box.submit()
    wait_for(lambda: names(browser) == ["job-02345"], "job-02345 alone")
    assert "q=JOB-02345" in browser.current_url  # the filtered view is a link
    assert "showing 1 of 1 matching" in where(browser)
    browser.get(browser.current_url)  # and the link shows it again
    wait_for(lambda: names(browser) == ["job-02345"], "job-02345 alone, from its link")


def test_filtering_by_tag_finds_one_job(fleet: Fleet, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(fleet.url + "/")
    box = wait_for(lambda: browser.find_element(By.NAME, "tag"), "the tag filter")
    box.send_keys("needle")
    box.submit()
    wait_for(lambda: names(browser) == [NEEDLE], f"{NEEDLE} alone")
    assert "tag=needle" in browser.current_url
    script = "return Array.from(document.querySelectorAll('tr.job a.tag')).map(a => a.textContent)"
    assert sorted(browser.execute_script(script)) == ["needle", "team-4"]


def test_paging_moves(fleet: Fleet, browser: Any) -> None:
    browser.get(fleet.url + "/?status=ok")
    first = wait_for(lambda: names(browser), "page 1 of the ok jobs")
    assert first[0] == "job-00001" and len(first) == 100
    click(browser, 'nav.pager a[rel="next"]')
    second = wait_for(lambda: names(browser) if "page 2 of 27" in where(browser) else [], "page 2")
    assert second[0] == "job-00112" and not set(first) & set(second)
    assert "page=2" in browser.current_url and "status=ok" in browser.current_url
    click(browser, 'nav.pager a[rel="prev"]')
    wait_for(lambda: "page 1 of 27" in where(browser), "page 1 again")
    assert names(browser) == first
