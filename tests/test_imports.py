"""What importing cronlock loads: only what the path in use needs (issue 10).

Asserted on the modules loaded, never on time: a fresh interpreter per case.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import cronlock
import cronlock.postgres


def _output_of(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout


def _loaded_after(code: str) -> set[str]:
    return set(_output_of(f"import sys\n{code}\nprint(' '.join(sys.modules))").split())


# The optional integrations' libraries: loaded only by the module that needs each.
_EXTRAS = {
    "prometheus_client",
    "opentelemetry",
    "starlette",
    "jinja2",
    "cronlock.prometheus",
    "cronlock.otel",
    "cronlock.web",
    "celery",
    "kombu",
    "cronlock.celery",
}


@pytest.mark.parametrize(
    ("code", "absent"),
    [
        ("import cronlock", {"asyncpg", "croniter", "anyio", "cronlock._scheduler", *_EXTRAS}),
        (
            "from cronlock import Scheduler, every",
            {
                "asyncpg",
                "croniter",
                "dateutil",
                "anyio",
                "calendar",
                "cronlock._schedules.cron",
                *_EXTRAS,
            },
        ),
        ("from cronlock import cron; cron('0 3 * * *')", {"asyncpg", "anyio", *_EXTRAS}),
        (
            "from cronlock import FleetView, FleetWatchingLocker, BatchLedgerLocker",
            {"asyncpg", "croniter", "cronlock._scheduler", *_EXTRAS},
        ),
        (
            "import cronlock.postgres",
            {"asyncpg", "croniter", "cronlock.postgres._locker.locker", *_EXTRAS},
        ),
        (
            "from cronlock.postgres import DEFAULT_TABLE",
            {"croniter", "cronlock.postgres._locker.locker", *_EXTRAS},
        ),
        # asyncpg is imported by the first connect (or came with the pool handed over).
        (
            "from cronlock.postgres import PostgresLocker, PostgresElector, locked_run\n"
            "dsn = 'postgresql://nobody@127.0.0.1:1/none'\n"
            "PostgresLocker(dsn); PostgresElector(dsn); locked_run(dsn, 'job')",
            {"asyncpg", "croniter", *_EXTRAS},
        ),
        # The queue senders take the queue's own objects: no queue library is imported.
        (
            "from cronlock.queues import arq_sender, procrastinate_sender, celery_sender, "
            "taskiq_sender, dramatiq_sender",
            {"arq", "procrastinate", "celery", "kombu", "taskiq", "dramatiq", "redis", *_EXTRAS},
        ),
    ],
)
def test_imports_load_only_what_is_used(code: str, absent: set[str]) -> None:
    assert not (_loaded_after(code) & absent)


def test_every_public_name_resolves() -> None:
    for package in (cronlock, cronlock.postgres):
        for name in package.__all__:
            assert getattr(package, name) is not None, name
        assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cronlock.nope  # noqa: B018


def test_the_first_connect_imports_asyncpg_and_its_errors_still_become_lock_errors() -> None:
    # asyncpg refuses this DSN itself, so the first exception the backend sees is one of
    # asyncpg's, raised just after its import: it must still become a LockError.
    code = """
import asyncio, sys
from cronlock import LockError
from cronlock.postgres import locked_run

async def main():
    try:
        async with locked_run("postgresql://nobody@127.0.0.1:1/none?sslmode=bogus", "job"):
            pass
    except LockError as exc:
        print(type(exc.__cause__).__name__, "asyncpg" in sys.modules)

print("asyncpg" in sys.modules)
asyncio.run(main())
"""
    assert _output_of(code).split() == ["False", "ClientConfigurationError", "True"]
