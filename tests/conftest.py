"""The suite's one process-wide setting: under pytest-xdist, a database of each worker's own.

``python -m pytest -n 4`` runs the suite in four worker processes. PostgreSQL's advisory
locks are scoped to a database, not a schema, and several tests count the locks held on a
key or hold a job's bare (seed-compatible) key: two workers in one database would see each
other's locks. So each worker that is given ``CRONLOCK_TEST_DSN`` makes a database of its
own on that server (``cronlock_test_<host>_<pid>_<worker>``), points ``CRONLOCK_TEST_DSN``
at it for its tests and their subprocesses, and drops it at its end. A database left by a
worker that was killed is dropped by the next run on this host. The database the user
named is never written by a worker; without xdist nothing here happens (the tests use
their throwaway schemas in it, as always). A role that may not create databases falls
back to the named database, with a warning.

Under xdist the tests marked ``slow`` are also handed out first (see
:func:`pytest_collection_modifyitems`), and the controller compiles the package and the
suite once before the workers start (:mod:`tests.bytecode`).
"""

from __future__ import annotations

import asyncio
import os
import warnings
from urllib.parse import urlsplit, urlunsplit

import pytest

from .bytecode import keep_bytecode, prime
from .throwaway import drop, make, prefix

_OWN_DATABASE = pytest.StashKey[tuple[str, str]]()


def _with_database(dsn: str, name: str) -> str | None:
    """*dsn* naming database *name* instead (URL DSNs only; None for another form)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        return None
    return urlunsplit(parts._replace(path=f"/{name}"))


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        keep_bytecode()
        if config.getoption("numprocesses", None):
            prime(config)
        return
    dsn = os.environ.get("CRONLOCK_TEST_DSN")
    if not dsn:
        return
    name = f"{prefix()}{os.getpid()}_{worker}"
    own = _with_database(dsn, name)
    if own is None:
        warnings.warn(
            f"CRONLOCK_TEST_DSN is not a URL: xdist worker {worker} shares its database",
            stacklevel=1,
        )
        return
    try:
        asyncio.run(make(dsn, "database", name))
    except Exception as exc:  # no CREATEDB right, say: share the named database
        warnings.warn(
            f"xdist worker {worker} could not make a database of its own ({exc!r}); it "
            "shares the one CRONLOCK_TEST_DSN names, where workers may see each other's locks",
            stacklevel=1,
        )
        return
    config.stash[_OWN_DATABASE] = (dsn, name)
    os.environ["CRONLOCK_TEST_DSN"] = own


@pytest.hookimpl(trylast=True)  # after xdist's own (see below)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the tests marked ``slow`` are handed out first (their order otherwise
    kept), so that no worker starts a two-minute test when the others are nearly done.

    And under ``--dist loadgroup`` each test marked ``xdist_group(NAME)`` is named
    ``NODEID@NAME``, the name xdist's scheduler groups by, so that one worker runs a group
    (a costly fleet or browser made once; tests that must not run beside each other).
    pytest-xdist 3.8 appends the suffix to ``item._nodeid``, which pytest 9.2 no longer
    reads (a node's id is ``item._id``): there its groups were silently ignored. Where
    xdist's own suffix took, this does nothing."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not config.getvalue("loadgroup"):
        return
    for item in items:
        groups = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(groups))
        if groups and not item.nodeid.endswith(suffix):
            from _pytest.nodeid import NodeId  # pytest >= 9.2 only, where it is needed

            item._id = NodeId.parse(item.nodeid + suffix)


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_OWN_DATABASE, None)
    if made is not None:
        dsn, name = made
        os.environ["CRONLOCK_TEST_DSN"] = dsn
        asyncio.run(drop(dsn, "database", name))
