"""Where a DSN points, said without its password; which DSN the command line uses.

A connect error can carry a password: a DSN whose password holds an unescaped ``/``, ``#``
or ``?`` is split in the wrong place, and asyncpg's parse error then quotes a piece of
the password ("invalid literal for int() with base 10: 'pa'" when it was read as the
port). So cronlock never repeats a connect error of a DSN it cannot parse cleanly: it
says the DSN could not be parsed, and where it points (user, host, port, database) when
it can. A server's or the network's answer to a DSN that parses cleanly is repeated, with
the password taken out should it appear.

Needs no asyncpg: the command line, the demo and the backend all use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = (
    "DSN_ENV",
    "PARSE_HINT",
    "Target",
    "answered",
    "cli_dsn",
    "connect_failure",
    "target_of",
)

DSN_ENV = "CRONLOCK_DSN"
"""The environment variable the command line's ledger verbs read when ``--dsn`` is not given."""

PARSE_HINT = (
    "the DSN could not be parsed (check that special characters in the password are "
    "percent-encoded: / as %2F, # as %23, ? as %3F, @ as %40)"
)

_SCHEMES = frozenset({"postgres", "postgresql"})
_LIBPQ_ENV = ("PGHOST", "PGPORT", "PGUSER", "PGDATABASE")
# What asyncpg reads from the environment given no DSN; one of them set says where to go.
_LIBPQ_ANY = (*_LIBPQ_ENV, "PGPASSWORD", "PGPASSFILE", "PGSSLMODE")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a DSN points: *clean* when it parses without doubt (then *where* says
    ``user@host:port/database``), and the secrets to take out of any message."""

    clean: bool
    where: str
    secrets: tuple[str, ...]


def target_of(dsn: str | None) -> Target:
    """Parse *dsn* strictly, never raising; ``None`` is libpq's environment (``PGHOST``...)."""
    if dsn is None:
        named = [f"{name}={os.environ[name]}" for name in _LIBPQ_ENV if os.environ.get(name)]
        where = f"the server of the environment ({', '.join(named) or 'libpq defaults'})"
        password = os.environ.get("PGPASSWORD")
        return Target(True, where, (password,) if password else ())
    secrets = _secrets(dsn)
    parts = urlsplit(dsn)
    hosts = _hosts(parts.netloc.rpartition("@")[2])
    if (
        hosts is None  # a port that is not one: a piece of the password read as it
        or parts.scheme not in _SCHEMES
        or parts.fragment  # an unescaped '#' in the password
        or "@" in parts.path + parts.query  # an unescaped '/' or '?' before the '@'
        or parts.netloc.count("@") > 1  # an unescaped '@'
    ):
        return Target(False, "", secrets)
    query = parse_qs(parts.query)
    user = unquote(parts.username or "") or next(iter(query.get("user", [])), "")
    database = unquote(parts.path.lstrip("/")) or next(iter(query.get("dbname", [])), "")
    host = hosts or next(iter(query.get("host", [])), "") or "localhost"
    where = f"{user + '@' if user else ''}{host}/{database or '-'}"
    return Target(True, where, secrets)


def _hosts(hostinfo: str) -> str | None:
    """``host:port`` for each host of a DSN's netloc (comma-separated, IPv6 in brackets),
    the default port filled in; ``None`` when a port is not a number."""
    shown = []
    for entry in hostinfo.split(",") if hostinfo else []:
        if entry.startswith("["):
            host, _, rest = entry[1:].partition("]")
            port = rest.removeprefix(":")
            host = f"[{host}]"
        else:
            host, _, port = entry.partition(":")
        if port and not port.isdigit():
            return None
        shown.append(f"{unquote(host) or 'localhost'}:{port or 5432}")
    return ",".join(shown)


def _secrets(dsn: str) -> tuple[str, ...]:
    """Every spelling of a password *dsn* may hold, however badly it is split: what lies
    between the scheme's ``//`` and the last ``@``, after the first ``:``, raw and decoded;
    and a ``password=`` query parameter."""
    found: set[str] = set()
    rest = dsn.partition("://")[2]
    userinfo, at, _ = rest.rpartition("@")
    if at and ":" in userinfo:
        password = userinfo.partition(":")[2]
        found |= {password, unquote(password)}
    for piece in dsn.replace("?", "&").split("&"):
        key, eq, value = piece.partition("=")
        if eq and key.strip().lower() == "password":
            found |= {value, unquote(value)}
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def answered(exc: BaseException) -> bool:
    """Whether a connect's *exc* is an answer of a server or of the network (asyncpg's
    server and protocol errors, an OSError), rather than asyncpg refusing the DSN itself
    (a ValueError, an OverflowError for a port out of range, ...)."""
    if isinstance(exc, OSError):
        return True
    return type(exc).__module__.startswith("asyncpg") and not isinstance(exc, ValueError)


def connect_failure(dsn: str | None, exc: BaseException) -> str:
    """What to say when connecting with *dsn* failed with *exc*, never its password.

    For a DSN that does not parse cleanly, *exc*'s text is left out (only its type is
    named): the password may be what asyncpg quotes. Otherwise the text is repeated with
    the password masked, should it appear.
    """
    target = target_of(dsn)
    if not target.clean:
        return f"{PARSE_HINT}; {type(exc).__name__}"
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else ""
    for secret in target.secrets:
        reason = reason.replace(secret, "***")
    refused = "" if answered(exc) else "the DSN or a connect option is invalid: "
    return f"{target.where}: {refused}{type(exc).__name__}{': ' if reason else ''}{reason}"


def cli_dsn(given: str | None) -> str | None:
    """The DSN the command line uses: *given* (``--dsn``), else ``$CRONLOCK_DSN``, else
    ``None``, which asyncpg reads as libpq's environment (``PGHOST``, ``PGPORT``,
    ``PGUSER``, ``PGPASSWORD``, ``PGDATABASE``). Raises :class:`ValueError` when none of
    them is set: connecting to libpq's defaults unasked would only confuse."""
    if given:
        return given
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        return dsn
    if any(os.environ.get(name) for name in _LIBPQ_ANY):
        return None
    raise ValueError(
        f"no database to connect to: pass --dsn, or set {DSN_ENV} (which keeps a password "
        "out of the process list), or libpq's PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE"
    )
