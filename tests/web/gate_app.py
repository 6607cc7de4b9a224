"""The dashboard served by a real uvicorn for the issue 24 tests: ``uvicorn
tests.web.gate_app:app``. Configured by the environment:

- ``CRONLOCK_WEB_DSN``, ``CRONLOCK_WEB_TABLE``: the ledger;
- ``CRONLOCK_WEB_MODE``: ``read-only`` (no actions), ``actions`` (a request may act when
  it names its operator in ``x-operator``, who is then named in the log), or ``gated``
  (as ``actions``, and reading needs an ``x-reader`` header too; ``x-boom`` makes the
  read gate raise).

The ``cronlock.web`` logger writes to stderr at INFO, so a test can read the actions' log.
"""

from __future__ import annotations

import logging
import os
import sys

from starlette.requests import Request

import cronlock.web

_MODE = os.environ.get("CRONLOCK_WEB_MODE", "read-only")


def _operator(request: Request) -> bool | str:
    return request.headers.get("x-operator") or False


def _reader(request: Request) -> bool:
    if "x-boom" in request.headers:  # an unexpected error: a 500
        raise RuntimeError("the read gate failed")
    return "x-reader" in request.headers


_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
logging.getLogger("cronlock.web").addHandler(_handler)
logging.getLogger("cronlock.web").setLevel(logging.INFO)

app = cronlock.web.app(
    os.environ["CRONLOCK_WEB_DSN"],
    table=os.environ["CRONLOCK_WEB_TABLE"],
    authorize=None if _MODE == "read-only" else _operator,
    authorize_read=_reader if _MODE == "gated" else None,
)
