"""Where a DSN points, said without its password (issue 24, item 2): the strict parse
behind every connect error cronlock reports."""

from __future__ import annotations

import pytest

from cronlock._dsn import PARSE_HINT, connect_failure, target_of


@pytest.mark.parametrize(
    ("dsn", "where"),
    [
        ("postgresql://app:pw@db:6432/billing", "app@db:6432/billing"),
        ("postgres://app@db/billing", "app@db:5432/billing"),
        ("postgresql://app:p%2Fw%23d@db/x", "app@db:5432/x"),  # percent-encoded: fine
        ("postgresql://u:pw@h1:5432,h2:5433/db", "u@h1:5432,h2:5433/db"),
        ("postgresql://u@[::1]:5432/db", "u@[::1]:5432/db"),
        ("postgresql:///db?host=/run/postgresql", "/run/postgresql/db"),
    ],
)
def test_a_clean_dsn_says_where_it_points(dsn: str, where: str) -> None:
    target = target_of(dsn)
    assert target.clean
    assert target.where == where


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:pa/ss#w?rd@127.0.0.1:5432/test",  # '/': the rest is the path
        "postgresql://u:pa#ss@h/db",  # '#': a fragment
        "postgresql://u:pa?ss@h/db",  # '?': a query
        "postgresql://u:p@ss@h/db",  # a second '@'
        "postgresql://u:pass@h:54x2/db",  # a port that is not one
        "host=db user=app password=secret",  # libpq's keyword form: asyncpg refuses it
    ],
)
def test_a_malformed_dsn_shows_nothing_of_the_error(dsn: str) -> None:
    assert not target_of(dsn).clean
    said = connect_failure(dsn, ValueError("invalid literal for int() with base 10: 'pa'"))
    assert said == f"{PARSE_HINT}; ValueError"


def test_the_password_is_masked_in_an_answer() -> None:
    dsn = "postgresql://app:s%3Acret@db/x?password=other"
    said = connect_failure(dsn, OSError("saw s:cret and s%3Acret and other"))
    assert said == "app@db:5432/x: OSError: saw *** and *** and ***"
