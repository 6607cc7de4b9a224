"""The job list of a fleet of thousands: a summary of every job's status, a filter (in the
URL, so a filtered view can be linked), failing and overdue first, and one page of rows.

Every job's status is judged from the fleet's roster (:mod:`cronlock.postgres._ops.roster`:
a few facts a job, one statement); only the rows of the page shown are read in full and
described (their latest runs, their schedule in words and next slot), which is what costs
per job.

What a request may ask of the dashboard (its query parameters, its action's form) is read
here too, strictly and bounded before anything else happens: a bad value is a 400 that
says what is allowed, never a 500 or a database error; a form over its limit is a 413
answered before the rest of the body is read (a client cannot make the server hold more
than the limit, whatever it sends).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..postgres._ops.fleet import STATUSES, FleetJob, Status
from ..postgres._ops.roster import Roster
from ._model import JobView, job_view

__all__ = (
    "MAX_FORM",
    "MAX_PAGE",
    "PER_PAGE",
    "Filter",
    "Listing",
    "Selection",
    "before_param",
    "filter_param",
    "limit_param",
    "listing",
    "read_form",
    "select",
)

PER_PAGE = 100
"""Rows of the job list per page unless ``per_page`` says otherwise."""
_MAX_PER_PAGE = 500
_MAX_QUERY = 200
_MAX_TAGS = 20
_FIRST: frozenset[Status] = frozenset(
    {"conflict", "rejected", "absent", "overdue", "failing"}
)  # shown first by default


@dataclass(frozen=True, slots=True)
class Filter:
    """What the list shows: names containing *text* (any case), of *statuses* (empty:
    all), with every one of *tags*, page *page* of *per_page* rows."""

    text: str = ""
    statuses: frozenset[Status] = frozenset()
    page: int = 1
    per_page: int = PER_PAGE
    tags: tuple[str, ...] = ()

    def query(self, page: int) -> str:
        """The query string of page *page* of this filter (for links)."""
        parts = [f"page={page}"]
        if self.text:
            parts.append(f"q={quote(self.text, safe='')}")
        parts.extend(f"tag={quote(tag, safe='')}" for tag in self.tags)
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
    """The list's filter from the query (``q``, ``status``, ``tag``, ``page``,
    ``per_page``); a bad value is a 400 that says what is allowed. ``status`` and ``tag``
    may be repeated or comma-separated: a job shown has one of the statuses and every tag."""
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
    tags: dict[str, None] = {}
    for given in params.getlist("tag"):
        tags.update(dict.fromkeys(filter(None, (p.strip() for p in given.split(",")))))
    if len(tags) > _MAX_TAGS or any(len(tag) > _MAX_QUERY for tag in tags):
        raise HTTPException(
            400, f"tag: at most {_MAX_TAGS} tags of at most {_MAX_QUERY} characters each"
        )
    page = _whole(params.get("page", "1"), "page", 1, 1_000_000)
    per_page = _whole(params.get("per_page", str(PER_PAGE)), "per_page", 1, _MAX_PER_PAGE)
    return Filter(text, frozenset(statuses), page, per_page, tuple(tags))


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


@dataclass(frozen=True, slots=True)
class Selection:
    """What the filter chose of the fleet's roster: the page's jobs, and the counts."""

    names: list[str]
    """The jobs of the page asked, in the order shown."""
    summary: dict[str, int]
    """Every status (and ``total``) with how many jobs of the fleet have it."""
    matched: int
    pages: int


def select(roster: Roster, wanted: Filter) -> Selection:
    """The page *wanted* asks of *roster* (every job, judged): overdue and failing jobs
    first, then the rest, each group by name."""
    statuses = roster.statuses
    counts = Counter(statuses.values())
    summary: dict[str, int] = {"total": len(statuses)}
    summary.update((status, counts.get(status, 0)) for status in STATUSES)
    text, chosen, tagged = wanted.text.casefold(), wanted.statuses, roster.tagged
    kept: Iterable[tuple[str, Status]] = statuses.items()
    if tagged is not None:
        kept = [(name, status) for name, status in kept if name in tagged]
    if text:
        kept = [(name, status) for name, status in kept if text in name.casefold()]
    if chosen:
        kept = [(name, status) for name, status in kept if status in chosen]
    first = sorted(name for name, status in kept if status in _FIRST)
    rest = sorted(name for name, status in kept if status not in _FIRST)
    matched = len(first) + len(rest)
    pages = max(1, math.ceil(matched / wanted.per_page))
    start = (wanted.page - 1) * wanted.per_page
    names = [*first, *rest][start : start + wanted.per_page]
    return Selection(names, summary, matched, pages)


def listing(
    chosen: Selection, fleet: list[FleetJob], paused: frozenset[str], now: datetime, wanted: Filter
) -> Listing:
    """The page *chosen* of the list *wanted*, its rows described from *fleet* (the page's
    jobs read in full) at *now* (server time); a job gone since the roster was read is left
    out."""
    found = {job.name: job for job in fleet}
    views = [
        job_view(found[name], now, paused=name in paused, upcoming=1)
        for name in chosen.names
        if name in found
    ]
    return Listing(views, chosen.summary, chosen.matched, wanted, chosen.pages)


# -- what a request may ask: its query parameters and its action's form -------------------

MAX_PAGE = 500
MAX_FORM = 4096

_TOO_LARGE = f"form too large: the dashboard's forms are under {MAX_FORM} bytes"


def before_param(request: Request) -> datetime | None:
    """The ``before`` instant of a page of runs, ``None`` when not given."""
    text = request.query_params.get("before")
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
        # In UTC it must still be a datetime: PostgreSQL is given it so, and a page of
        # runs before year 1 (or after 9999) is a bad request, not a database failure.
        in_utc = value.astimezone(UTC) if value.tzinfo is not None else None
    except (ValueError, OverflowError):
        in_utc = None
    if in_utc is None:
        raise HTTPException(
            400, "before must be an ISO 8601 instant with an offset, in years 1 to 9999 in UTC"
        )
    return value


def limit_param(request: Request, default: int) -> int:
    """The ``limit`` of a page of runs: ASCII digits, 1 to :data:`MAX_PAGE`."""
    text = request.query_params.get("limit", str(default))
    # str.isdigit() also accepts "²" and other digits int() refuses: ASCII only.
    if not (text.isascii() and text.isdigit() and len(text) <= 4 and 1 <= int(text) <= MAX_PAGE):
        raise HTTPException(400, f"limit must be a whole number from 1 to {MAX_PAGE}")
    return int(text)


async def read_form(request: Request) -> dict[str, str]:
    """The action's form (urlencoded), read as it streams in and refused (413) as soon
    as it is over :data:`MAX_FORM` bytes: by its Content-Length before reading any of it,
    else at the chunk that crosses the limit. The rest is never read."""
    length = request.headers.get("content-length")
    if length is not None and not (
        length.isascii() and length.isdigit() and int(length) <= MAX_FORM
    ):
        raise HTTPException(413, _TOO_LARGE)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise HTTPException(413, _TOO_LARGE)
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
