"""What a request may ask of the dashboard: its query parameters and its action's form.

Each is read strictly and bounded before anything else happens: a bad value is a 400 that
says what is allowed, never a 500 or a database error; a form over its limit is a 413
answered before the rest of the body is read (a client cannot make the server hold more
than the limit, whatever it sends).
"""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request

__all__ = ("MAX_FORM", "MAX_PAGE", "before_param", "limit_param", "read_form")

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
