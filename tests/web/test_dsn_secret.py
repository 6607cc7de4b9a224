"""The dashboard given a malformed DSN (a password with an unescaped ``/``, ``#`` and
``?``): each page is a 503, and neither the page nor the log repeats any piece of the
password, which asyncpg's parse error quotes (issue 24, item 2)."""

from __future__ import annotations

import logging

import httpx
import pytest

import cronlock.web

MALFORMED = "postgresql://u:pa/ss#w?rd@127.0.0.1:5432/test"
FRAGMENTS = ("pa/ss", "'pa'", "w?rd", "ss#w", "rd@")


async def test_a_malformed_dsn_is_a_503_and_a_log_line_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    dashboard = cronlock.web.app(MALFORMED)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        answers = [await c.get(url) for url in ("/", "/api/jobs", "/jobs/x")]
    assert [a.status_code for a in answers] == [503, 503, 503]
    formatter = logging.Formatter()
    logged = "\n".join(formatter.format(r) for r in caplog.records)
    assert "the DSN could not be parsed" in logged
    for fragment in FRAGMENTS:
        assert all(fragment not in a.text for a in answers)
        assert fragment not in logged, logged
