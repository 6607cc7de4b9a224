"""The project's workflow: ``nox -s tests lint typing docs``.

``bench``, ``simulate``, ``fleet`` and ``soak`` are separate.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "lint", "typing", "docs"]
nox.options.reuse_existing_virtualenvs = True

PYTHONS = ["3.11", "3.12", "3.13"]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the test suite with coverage (PostgreSQL tests need CRONLOCK_TEST_DSN)."""
    session.install("-e", ".[postgres,web,prometheus,otel,test,examples]")
    session.run(
        "python",
        "-m",
        "pytest",
        *("-n", "6", "--dist", "loadgroup"),  # as the README's command (tests/conftest.py)
        "--cov=cronlock",
        "--cov-report=term",
        *session.posargs,
        env={"CRONLOCK_TEST_DSN": os.environ.get("CRONLOCK_TEST_DSN", "")},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff")
    paths = ("src", "tests", "benchmarks", "examples", "docs/_tools", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session
def typing(session: nox.Session) -> None:
    """mypy --strict on src, tests and examples."""
    session.install("-e", ".[postgres,web,prometheus,otel,test,lint,examples]")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly (``nox -s docs -- serve`` serves it locally)."""
    session.install("-e", ".[docs]")
    env = {"NO_MKDOCS_2_WARNING": "1"}
    if session.posargs and session.posargs[0] == "serve":
        session.run("mkdocs", "serve", "--strict", *session.posargs[1:], env=env)
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs, env=env)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks side by side with the peers (not part of the test run)."""
    session.install("-e", ".[postgres]", "-r", "benchmarks/requirements.txt")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def simulate(session: nox.Session) -> None:
    """The fleet simulation: random fault schedules judged by the oracle (docs/testing.md)."""
    session.install("-e", ".[postgres]")
    session.run("python", "benchmarks/simulate.py", *(session.posargs or ["--schedules", "200"]))


@nox.session
def fleet(session: nox.Session) -> None:
    """Fleet scale: 3/30/100 replica processes, throwaway clusters (``-- --quick``, ``--rows``)."""
    session.install("-e", ".[postgres]")
    session.run("python", "benchmarks/fleet.py", *session.posargs)


@nox.session
def failover(session: nox.Session) -> None:
    """Failover: a primary lost and a standby promoted under three replicas (``-- --rows``)."""
    session.install("-e", ".[postgres]")
    session.run("python", "benchmarks/failover.py", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """The nemesis soak, both modes, 60 s of faults each (``-- --minutes 30``, ``--seed N``)."""
    session.install("-e", ".[postgres]")
    session.run("python", "benchmarks/soak/run.py", *session.posargs)
