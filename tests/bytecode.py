"""Bytecode made once, before the xdist workers start.

Each worker imports every test module, and pytest rewrites the asserts of each before it
runs (about 280 modules: some 10 s of one core). With ``PYTHONDONTWRITEBYTECODE`` set, as
container images often do, nothing is cached: every worker rewrites every module, and every
replica, beat or service process a test starts compiles the package again. Six to eight
workers on two cores then spend their first minute compiling.

So under xdist the controller, before it starts the workers, compiles ``src/`` and
``tests/`` once (assert-rewritten test modules as pytest caches them), and the workers and
their subprocesses read that. Where the user asked for no bytecode beside the sources, it
goes under ``.pytest_cache/pycache`` instead (``PYTHONPYCACHEPREFIX``), never into the tree.
"""

from __future__ import annotations

import compileall
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_TESTS = re.compile(r"(^|[/\\])(test_[^/\\]*|conftest)\.py$")


def keep_bytecode() -> None:
    """Where ``PYTHONDONTWRITEBYTECODE`` is set, write bytecode under ``.pytest_cache``
    instead, for this process and the ones it starts."""
    if not sys.dont_write_bytecode:
        return
    prefix = str(ROOT / ".pytest_cache" / "pycache")
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix


def prime(config: pytest.Config) -> None:
    """Compile the package and the suite's helpers, and rewrite the test modules, as the
    workers will read them. Best effort: anything pytest does not offer is left to them."""
    compileall.compile_dir(ROOT / "src", quiet=1)
    compileall.compile_dir(ROOT / "tests", quiet=1, rx=_TESTS)
    try:
        from _pytest.assertion import rewrite
    except ImportError:  # pragma: no cover - another pytest
        return
    state = config.stash.get(rewrite.assertstate_key, None)
    if state is None:  # assertion rewriting is off (--assert=plain)
        return
    for source in sorted((ROOT / "tests").rglob("*.py")):
        if not _TESTS.search(str(source)):
            continue
        cache = rewrite.get_cache_dir(source)
        if not rewrite.try_makedirs(cache):
            return
        pyc = cache / (source.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(source, pyc, state.trace) is not None:
            continue
        stamp, code = rewrite._rewrite_test(source, config)
        rewrite._write_pyc(state, code, stamp, pyc)
