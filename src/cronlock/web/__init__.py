"""A live web dashboard of the fleet, read from the run ledger: ``cronlock.web.app(pool)``.

Needs the ``web`` extra (Starlette, Jinja2, asyncpg, and uvicorn for ``python -m cronlock
web``): ``pip install -e '.[web]'`` from a clone, ``pip install 'cronlock[web]'`` once
cronlock is on PyPI. See ``docs/dashboard.md``.
"""

try:  # fail here, with instructions, rather than deeper inside
    import jinja2 as _jinja2
    import starlette as _starlette
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cronlock.web needs Starlette and Jinja2, which are not installed; "
        "install the extra with: pip install 'cronlock[web]' (from a clone of the "
        "repository, until cronlock is on PyPI: pip install -e '.[web]')"
    ) from exc

from ._aiohttp import aiohttp_handler as aiohttp_handler
from ._app import app as app
from ._authorize import Action as Action
from ._authorize import Authorize as Authorize
from ._schedules import Redact as Redact

__all__ = ("Action", "Authorize", "Redact", "aiohttp_handler", "app")

del _jinja2, _starlette
