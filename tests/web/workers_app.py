"""The dashboard as a multi-worker server runs it: ``uvicorn tests.web.workers_app:app
--workers 3``. Each worker process imports this module and builds its own app, with the
default CSRF key (no ``csrf_secret``); every answer names the worker that gave it
(``x-worker-pid``). Configured by ``CRONLOCK_WEB_DSN`` and ``CRONLOCK_WEB_TABLE``.
"""

from __future__ import annotations

import os

import cronlock.web

from ..multiworker import pid_marked

_dashboard = cronlock.web.app(
    os.environ["CRONLOCK_WEB_DSN"],
    table=os.environ["CRONLOCK_WEB_TABLE"],
    authorize=lambda request: True,
)
app = pid_marked(_dashboard)
"""The dashboard, each answer marked with this worker's pid."""
