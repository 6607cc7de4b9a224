"""The example services' tests use the PostgreSQL fixtures of ``tests/postgres``.

``pg_dsn`` gives a DSN whose ``search_path`` starts with a throwaway schema, so the
services' heartbeat table and run ledger land there and are dropped at the end.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from ..postgres.conftest import admin as admin
from ..postgres.conftest import free_port as free_port
from ..postgres.conftest import pg_dsn as pg_dsn
from ..postgres.conftest import pg_server as pg_server

# What the examples and their servers need: the ``examples`` extra.
EXAMPLES_EXTRA = ("fastapi", "uvicorn", "aiohttp", "gunicorn")


@pytest.fixture(scope="session")
def examples_extra() -> None:
    """Skip, loudly, without the ``examples`` extra; under ``CI`` that is a failure."""
    missing = [name for name in EXAMPLES_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        message = (
            f"EXAMPLES NOT TESTED: {', '.join(missing)} not installed; "
            "pip install -e '.[postgres,test,examples]'"
        )
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
