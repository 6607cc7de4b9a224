"""The message brokers the queue hand-off tests use: Redis (``CRONLOCK_TEST_REDIS``, default
``redis://127.0.0.1:6379/0``) and RabbitMQ (``CRONLOCK_TEST_AMQP``, default
``amqp://guest:guest@127.0.0.1:5672//``), and the queue libraries they drive.

Both brokers may be shared with others: every test uses names of its own (:func:`unique`)
and deletes what it wrote; nothing is flushed. A broker or library that is missing skips
the test, loudly, except when ``CI`` is set: then it fails, as the PostgreSQL tests do.
"""

from __future__ import annotations

import importlib
import os
import socket
import uuid
from types import ModuleType
from urllib.parse import urlsplit

import pytest

REDIS_URL = os.environ.get("CRONLOCK_TEST_REDIS", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("CRONLOCK_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")


def missing(what: str) -> None:
    """Fail (``CI`` set) or skip the test: *what* is not here."""
    message = f"NOT AVAILABLE: {what}; the queue hand-off test did not run"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def library(name: str) -> ModuleType:
    """Import *name* (a queue library), or fail/skip: see :func:`missing`."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"the library {name} ({exc}); install the extra of the same name")
        raise  # not reached: missing() raises


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def redis_url() -> str:
    """The Redis server's URL, or fail/skip when nothing answers there."""
    if not _answers(REDIS_URL, 6379):
        missing(f"no Redis server at {REDIS_URL} (CRONLOCK_TEST_REDIS)")
    return REDIS_URL


def amqp_url() -> str:
    """The RabbitMQ server's URL, or fail/skip when nothing answers there."""
    if not _answers(AMQP_URL, 5672):
        missing(f"no RabbitMQ server at {AMQP_URL} (CRONLOCK_TEST_AMQP)")
    return AMQP_URL


def unique(kind: str) -> str:
    """A name no other test (of this run or another's) uses: ``cronlock-test-<kind>-<hex>``."""
    return f"cronlock-test-{kind}-{uuid.uuid4().hex[:12]}"
