"""The dashboard as a person uses it: real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against a real uvicorn server process, with real
replica processes running jobs on a real PostgreSQL.

Without the browser these tests skip, loudly; with ``CI`` set they fail instead.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest

from cronlock.postgres import FleetControl

from ..eventually import eventually_blocking
from ..postgres.conftest import free_port
from .seed import table_name

# One worker runs them all (pytest -n): one browser, one fleet of replicas, one server. The
# tests share them but not an order: each sets up the cookies it needs, pauses only to
# resume, and only one test stops a replica (``c``: no other test needs ``doomed`` run).
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("browser")]

HERE = Path(__file__).parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
XSS = "<script>window.pwned=1</script>"
TOKEN = "operator-token-for-the-test"
WAIT = 60.0  # generous: a liveness bound for a busy machine, not a measurement
T = TypeVar("T")


def _no_browser(reason: str) -> None:
    message = (
        f"NO BROWSER: the dashboard's browser tests did not run: {reason}; install them with "
        "'apt-get install -y chromium chromium-driver' and 'pip install selenium'"
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium through Debian's chromedriver (never a downloaded one)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        _no_browser(f"{', '.join(missing)} missing")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _no_browser(f"selenium is not installed ({exc})")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,900")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Fleet:
    """The replica processes and the dashboard server of this module.

    :meth:`replica` and :meth:`server` only start their process, so that they start side
    by side; :meth:`ready` waits until each has said it is running (the server: answers).
    """

    def __init__(self, dsn: str, table: str) -> None:
        self.dsn = dsn
        self.table = table
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: dict[str, subprocess.Popen[str]] = {}

    def replica(self, name: str, *jobs: str) -> None:
        args = [sys.executable, str(HERE / "fleet_replica.py"), "--dsn", self.dsn]
        args += ["--table", self.table, "--id", name]
        for job in jobs:
            args += ["--job", job]
        self.processes[name] = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)

    def server(self) -> None:
        args = [sys.executable, str(HERE / "server.py"), "--dsn", self.dsn]
        args += ["--table", self.table, "--port", str(self.port), "--token", TOKEN]
        self.processes["server"] = subprocess.Popen(args, text=True)

    def ready(self) -> None:
        """Once every replica started has printed ``running`` and the server answers."""
        for name, process in self.processes.items():
            if process.stdout is not None:  # a replica
                said = process.stdout.readline().strip()
                assert said == "running", f"replica {name} did not start: {said!r}"
        if "server" in self.processes:
            wait_for(lambda: _answers(self.url + "/api/jobs"), "the dashboard server to answer")

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()

    def close(self) -> None:
        """Stop every process: all told at once, then each waited for."""
        stopping = list(self.processes.items())
        self.processes.clear()
        for _, process in stopping:
            process.send_signal(signal.SIGTERM)
        for _, process in stopping:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    def sql(self, query: str, *params: Any) -> Any:
        async def run() -> Any:
            conn = await asyncpg.connect(self.dsn)
            try:
                return await conn.fetchval(query, *params)
            finally:
                await conn.close()

        return asyncio.run(run())

    def paused(self) -> frozenset[str]:
        async def read() -> frozenset[str]:
            async with FleetControl(self.dsn, table=self.table) as control:
                return await control.paused()

        return asyncio.run(read())


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(check: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    """:func:`eventually_blocking` for the page: an element the live update replaced
    meanwhile (stale) or one not there yet only means "not yet"."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    not_yet = (StaleElementReferenceException, NoSuchElementException, KeyError)
    return eventually_blocking(check, what, timeout, every=0.2, ignoring=not_yet)


@pytest.fixture(scope="module")
def fleet(pg_dsn: str, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Two replicas sharing ``tick`` (every second), the XSS-named job, a slow one and a
    failing one, a third running ``doomed``, and the dashboard server; the browser starts
    while they do."""
    fleet = Fleet(pg_dsn, table_name())
    try:
        fleet.replica("a", "tick=1", f"{XSS}=2", "slow-report=2", "failing-export=3")
        fleet.replica("b", "tick=1", f"{XSS}=2", "slow-report=2", "failing-export=3")
        fleet.replica("c", "doomed=2")
        fleet.server()
        request.getfixturevalue("browser")  # or the loud skip (CI: failure) without one
        fleet.ready()
        yield fleet
    finally:
        fleet.close()


def rows(browser: Any) -> dict[str, Any]:
    """The job rows of the list page by job name (the name as the page shows it)."""
    from selenium.webdriver.common.by import By

    found = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "tr.job"):
        found[row.find_element(By.CSS_SELECTOR, "td.name a").text] = row
    return found


def test_the_page_lists_the_jobs(fleet: Fleet, browser: Any) -> None:
    browser.get(fleet.url + "/")
    wait_for(lambda: {"tick", "doomed", XSS} <= set(rows(browser)), "the three jobs listed")
    assert "read-only" not in browser.find_element("css selector", "header .mode").text


def test_the_lock_holder_and_a_failure_show(fleet: Fleet, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(fleet.url + "/")

    def held() -> bool:
        cell = str(rows(browser)["slow-report"].find_element(By.CSS_SELECTOR, "td.holder").text)
        return "cronlock-web-replica-" in cell

    wait_for(held, "a replica named as the holder of slow-report's lock")

    def failing() -> bool:
        return bool(rows(browser)["failing-export"].get_attribute("data-status") == "failing")

    wait_for(failing, "failing-export shown failing")
    browser.get(fleet.url + "/jobs/failing-export")
    error = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "code.error").text, "error")
    assert error == "RuntimeError: failing-export failed on purpose"


def test_a_run_appears_without_reloading(fleet: Fleet, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(fleet.url + "/jobs/tick")
    browser.execute_script("window.notReloaded = true;")
    first = wait_for(
        lambda: str(browser.find_element(By.CSS_SELECTOR, "table.runs tbody tr td").text),
        "the newest run of tick",
    )

    def newer() -> bool:
        cell = str(browser.find_element(By.CSS_SELECTOR, "table.runs tbody tr td").text)
        return cell != first and cell.endswith("UTC")

    wait_for(newer, "a newer run of tick on its page")
    assert browser.execute_script("return window.notReloaded === true;")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart rect")  # the chart is drawn


def test_an_xss_shaped_name_is_text(fleet: Fleet, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(fleet.url + "/")
    wait_for(lambda: XSS in rows(browser), "the XSS-named job")
    assert browser.execute_script("return window.pwned === undefined;")

    def open_it() -> bool:
        rows(browser)[XSS].find_element(By.CSS_SELECTOR, "td.name a").click()
        return True

    wait_for(open_it, "the XSS-named job's link")
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "h1.job-name").text == XSS, "its page")
    assert browser.execute_script("return window.pwned === undefined;")


def test_an_overdue_job_turns_red(fleet: Fleet, browser: Any) -> None:
    browser.get(fleet.url + "/")

    def ok() -> bool:
        return bool(rows(browser)["doomed"].get_attribute("data-status") == "ok")

    wait_for(ok, "doomed ok")
    fleet.stop("c")  # its only replica goes away: nobody runs doomed any more

    def red() -> bool:
        row = rows(browser)["doomed"]
        color = str(row.value_of_css_property("background-color"))
        return bool(row.get_attribute("data-status") == "overdue") and color in (
            "rgb(253, 226, 226)",
            "rgba(253, 226, 226, 1)",
        )

    wait_for(red, "doomed to turn red without a reload")


def _click(browser: Any, job: str, action: str) -> None:
    from selenium.webdriver.common.by import By

    def click() -> bool:
        row = rows(browser)[job]
        row.find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]').click()
        return True

    wait_for(click, f"the {action} button of {job}")


def test_an_unauthorized_pause_is_refused(fleet: Fleet, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(fleet.url + "/")
    wait_for(lambda: "tick" in rows(browser), "tick listed")
    _click(browser, "tick", "pause")
    wait_for(lambda: browser.find_element(By.TAG_NAME, "h1").text == "403", "the 403 page")
    assert "refused" in browser.find_element(By.CSS_SELECTOR, ".error-detail").text
    assert fleet.paused() == frozenset()


def test_an_authorized_pause_works(fleet: Fleet, browser: Any) -> None:
    browser.get(fleet.url + "/")
    browser.add_cookie({"name": "operator", "value": TOKEN, "path": "/"})
    browser.get(fleet.url + "/")
    wait_for(lambda: "tick" in rows(browser), "tick listed")
    _click(browser, "tick", "pause")
    wait_for(lambda: rows(browser)["tick"].get_attribute("data-status") == "paused", "paused")
    assert fleet.paused() == {"tick"}
    _click(browser, "tick", "resume")
    wait_for(lambda: rows(browser)["tick"].get_attribute("data-status") != "paused", "resumed")
    assert fleet.paused() == frozenset()


def test_screenshots(fleet: Fleet, browser: Any, tmp_path: Path) -> None:
    """The main pages as images; into docs/ when CRONLOCK_SCREENSHOTS names a folder."""
    folder = Path(os.environ.get("CRONLOCK_SCREENSHOTS") or tmp_path)
    browser.delete_all_cookies()
    browser.get(fleet.url + "/")
    wait_for(lambda: "tick" in rows(browser), "tick listed")
    assert browser.save_screenshot(str(folder / "dashboard-jobs.png"))
    browser.get(fleet.url + "/jobs/tick")
    assert browser.save_screenshot(str(folder / "dashboard-job.png"))
    assert (folder / "dashboard-job.png").stat().st_size > 10_000
