"""The job list of a fleet of thousands: a summary of every job's status, a filter (in the
URL, so a filtered view can be linked), failing and overdue first, and one page of rows.

Every job's status is judged (cheap: the fleet read has what it needs); only the rows of
the page shown are described (their schedule in words and next slot), which is what
costs per job.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..postgres._fleet import STATUSES, FleetJob, Status, job_status
from ._model import JobView, job_view

__all__ = ("PER_PAGE", "Filter", "Listing", "filter_param", "listing")

PER_PAGE = 100
"""Rows of the job list per page unless ``per_page`` says otherwise."""
_MAX_PER_PAGE = 500
_MAX_QUERY = 200
_FIRST: frozenset[Status] = frozenset({"overdue", "failing"})  # shown first by default


@dataclass(frozen=True, slots=True)
class Filter:
    """What the list shows: names containing *text* (any case), of *statuses* (empty:
    all), page *page* of *per_page* rows."""

    text: str = ""
    statuses: frozenset[Status] = frozenset()
    page: int = 1
    per_page: int = PER_PAGE

    def query(self, page: int) -> str:
        """The query string of page *page* of this filter (for links)."""
        parts = [f"page={page}"]
        if self.text:
            from urllib.parse import quote

            parts.append(f"q={quote(self.text, safe='')}")
        if self.statuses:
            parts.append("status=" + ",".join(s for s in STATUSES if s in self.statuses))
        if self.per_page != PER_PAGE:
            parts.append(f"per_page={self.per_page}")
        return "&".join(parts)


def _whole(text: str, name: str, low: int, high: int) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and low <= int(text) <= high):
        raise HTTPException(400, f"{name} must be a whole number from {low} to {high}")
    return int(text)


def filter_param(request: Request) -> Filter:
    """The list's filter from the query (``q``, ``status``, ``page``, ``per_page``); a bad
    value is a 400 that says what is allowed."""
    params = request.query_params
    text = params.get("q", "").strip()
    if len(text) > _MAX_QUERY:
        raise HTTPException(400, f"q must be at most {_MAX_QUERY} characters")
    statuses: set[Status] = set()
    for given in params.getlist("status"):
        for part in filter(None, (p.strip() for p in given.split(","))):
            if part not in STATUSES:
                raise HTTPException(400, f"unknown status {part!r}; valid: {', '.join(STATUSES)}")
            statuses.add(part)
    page = _whole(params.get("page", "1"), "page", 1, 1_000_000)
    per_page = _whole(params.get("per_page", str(PER_PAGE)), "per_page", 1, _MAX_PER_PAGE)
    return Filter(text, frozenset(statuses), page, per_page)


@dataclass(frozen=True, slots=True)
class Listing:
    """One page of the job list, and what the whole fleet looks like."""

    jobs: list[JobView]
    summary: dict[str, int]
    """Every status (and ``total``) with how many jobs of the fleet have it."""
    matched: int
    """How many jobs the filter matches."""
    filter: Filter
    pages: int

    def json(self) -> dict[str, Any]:
        """The page for the JSON API."""
        return {
            "summary": self.summary,
            "matched": self.matched,
            "page": self.filter.page,
            "pages": self.pages,
            "per_page": self.filter.per_page,
            "jobs": [job.json() for job in self.jobs],
        }


def listing(
    fleet: list[FleetJob], paused: frozenset[str], now: datetime, wanted: Filter
) -> Listing:
    """The page *wanted* asks of *fleet* at *now* (server time); overdue and failing jobs
    first, then the rest, each group by name."""
    judged = [(job, job_status(job, now, paused=job.name in paused)) for job in fleet]
    counts = Counter(status for _, status in judged)
    summary: dict[str, int] = {"total": len(judged)}
    summary.update((status, counts.get(status, 0)) for status in STATUSES)
    text = wanted.text.casefold()
    kept = [
        (job, status)
        for job, status in judged
        if (not text or text in job.name.casefold())
        and (not wanted.statuses or status in wanted.statuses)
    ]
    kept.sort(key=lambda pair: (pair[1] not in _FIRST, pair[0].name))
    pages = max(1, math.ceil(len(kept) / wanted.per_page))
    start = (wanted.page - 1) * wanted.per_page
    shown = kept[start : start + wanted.per_page]
    views = [job_view(job, now, paused=job.name in paused, upcoming=1) for job, _ in shown]
    return Listing(views, summary, len(kept), wanted, pages)
