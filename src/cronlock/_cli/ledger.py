"""``python -m cronlock migrate|status|history|pause|resume|trigger|schedules|web|grants``: the
ledger verbs' arguments and dispatch.

The verbs themselves run on asyncpg, in :mod:`cronlock.postgres._ops.cli`; this module only
declares their arguments, so the command line (``next``, ``demo``) works without the
``postgres`` extra.
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from .._dsn import DSN_ENV, cli_dsn
from .._errors import CronlockError

__all__ = ("PG_VERBS", "add_pg_parsers", "run_pg")

PG_VERBS = frozenset(
    {
        *("migrate", "status", "history", "pause", "resume", "trigger", "retire"),
        *("schedules", "web", "grants"),
    }
)

# `history -n` beyond this is a mistake rather than a question; a number past the server's
# bigint failed in the driver with a traceback.
MAX_HISTORY = 10_000


def _history_count(text: str) -> int:
    """``-n``'s value: a whole number from 1 to :data:`MAX_HISTORY` (argparse says which)."""
    shown = repr(text) if len(text) <= 30 else f"{text[:30]!r}... ({len(text)} characters)"
    try:
        count = int(text)
    except ValueError:  # not digits, or more than int() reads (4,300)
        raise argparse.ArgumentTypeError(f"not a whole number: {shown}") from None
    if not 1 <= count <= MAX_HISTORY:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_HISTORY}, got {shown}")
    return count


_SPAN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _instant(text: str) -> datetime | timedelta:
    """``--since``/``--until``: an ISO 8601 instant with its offset, or a span before the
    server's now (a ``timedelta``, resolved against the server's clock)."""
    shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}..."
    unit = _SPAN_UNITS.get(text[-1:])
    if unit is not None and text[:-1].replace(".", "", 1).isdigit():
        return timedelta(seconds=float(text[:-1]) * unit)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 instant nor a span (90s, 15m, 2h, 1d): {shown}"
        ) from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{shown} names no zone (add +00:00 or Z)")
    return value.astimezone(UTC)


def add_pg_parsers(verbs: Any) -> None:
    """Register ``migrate``, ``status``, ``history`` and the fleet control verbs."""

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--dsn",
            help=f"PostgreSQL DSN (postgresql://...; default: ${DSN_ENV}, else libpq's "
            "PGHOST, PGUSER, PGPASSWORD, PGDATABASE...: a password there stays out of ps)",
        )
        parser.add_argument("--schema", help="schema of the ledger (default: search_path)")
        parser.add_argument("--table", default=None, help="ledger table (cronlock_runs)")

    migrate = verbs.add_parser("migrate", help="create the run ledger tables if missing")
    common(migrate)
    status = verbs.add_parser(
        "status", help="per job: last success and failure, next slot, who holds the lock"
    )
    common(status)
    status.add_argument(
        "jobs", nargs="*", metavar="JOB", help="only these jobs (exit status 1 if one is unknown)"
    )
    status.add_argument(
        "--state",
        action="append",
        metavar="STATES",
        help="only jobs in these states, as the STATE column names them, comma-separated "
        "(e.g. failing,overdue; repeatable)",
    )
    status.add_argument(
        "--check",
        action="store_true",
        help="health check: exit status 1, naming them, if jobs are overdue, absent (no live "
        "replica runs them) or rejected by every replica (0 otherwise; failing jobs count "
        "once overdue; --state does not change it)",
    )
    status.add_argument(
        "--allow-absent",
        action="store_true",
        help="with --check: absent jobs do not fail it (a fleet scaled to zero on purpose)",
    )
    history = verbs.add_parser("history", help="the latest runs of one job from the ledger")
    common(history)
    history.add_argument("job", metavar="JOB", help="exit status 1 if the ledger does not know it")
    history.add_argument(
        "-n",
        type=_history_count,
        default=20,
        help=f"how many runs, 1 to {MAX_HISTORY} (default: 20)",
    )
    history.add_argument(
        "--slots",
        action="store_true",
        help="every slot of the job's schedule in a window, with its fate (ran, ran_late, "
        "coalesced, missed, skipped) and why, from the ledger alone",
    )
    history.add_argument(
        "--since",
        type=_instant,
        help="with --slots: from this instant (ISO 8601 with its offset, or a span ago: "
        "90s, 15m, 2h, 1d; default: a day before --until)",
    )
    history.add_argument(
        "--until",
        type=_instant,
        help="with --slots: up to this instant (as --since; default: now)",
    )
    history.add_argument(
        "--json", action="store_true", help="with --slots: a JSON array, one object a slot"
    )
    for verb, what in (
        ("pause", "pause a job on every replica (until resume)"),
        ("resume", "resume a paused job on every replica"),
        ("trigger", "run a job once now, on exactly one replica"),
        ("retire", "leave an absent job (no replica runs it) out of status and the dashboard"),
    ):
        control = verbs.add_parser(verb, help=what)
        common(control)
        control.add_argument("job", metavar="JOB", help="the job's name")
        control.add_argument(
            "--force",
            action="store_true",
            help="retire: even if a live replica still runs the job; the others: even if "
            "the ledger does not know the job yet"
            + (" or no replica can run it (rejected everywhere)" if verb == "trigger" else ""),
        )

    _add_schedules_parser(verbs, common)
    _add_grants_parser(verbs)

    web = verbs.add_parser("web", help="serve the live dashboard of the fleet (read-only)")
    common(web)
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    web.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    web.add_argument(
        "--refresh", type=float, default=3.0, help="seconds between live updates (default: 3)"
    )


def _add_grants_parser(verbs: Any) -> None:
    """``grants``: the GRANT statements of the replica, operator and reader roles."""
    grants = verbs.add_parser(
        "grants",
        help="print the GRANT statements each role needs: replica, operator, reader "
        "(run them as the ledger's owner)",
    )
    grants.add_argument("--schema", help="schema of the ledger (default: search_path)")
    grants.add_argument("--table", default=None, help="ledger table (cronlock_runs)")
    for part, what in (
        ("replica", "the replicas' (PostgresLocker)"),
        (
            "operator",
            "the operators' (pause, resume, trigger, retire, schedule edits, "
            "the dashboard's actions)",
        ),
        ("reader", "the readers' (status, history, schedules list, the read-only dashboard)"),
    ):
        grants.add_argument(
            f"--{part}",
            metavar="ROLE",
            default=f"cronlock_{part}",
            help=f"{what} role (default: cronlock_{part}); '' leaves its grants out",
        )
    grants.add_argument(
        "--mode",
        choices=("session", "lease"),
        default="session",
        help="the replicas' PostgresLocker mode (default: session; lease writes leases)",
    )
    grants.add_argument(
        "--keyed",
        action="store_true",
        help="the replicas use lock_keys='keyed' (they read and make the ledger's secret)",
    )


def _add_schedules_parser(verbs: Any, common: Any) -> None:
    """``schedules list|add|update|remove|put|sync``: the stored schedules (FleetControl's
    verbs)."""
    schedules = verbs.add_parser(
        "schedules",
        help="list, add, update or remove the schedules stored in the ledger, or put or "
        "sync many from a JSON-lines file",
    )
    actions = schedules.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every stored schedule, with its problem if any")
    common(listing)
    listing.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line (name, task, schedule, kwargs, options): what put and "
        "sync read",
    )
    for action, what in (
        ("put", "store every schedule of FILE (create or replace by name), as one revision"),
        (
            "sync",
            "make the stored schedules under --prefix exactly those of FILE (adds, updates, "
            "removes), as one revision",
        ),
    ):
        bulk = actions.add_parser(action, help=what)
        common(bulk)
        if action == "sync":
            bulk.add_argument(
                "--prefix",
                required=True,
                help="the names this sync owns: stored schedules under it that FILE does not "
                "name are removed, the others are left alone ('' : every stored schedule)",
            )
        bulk.add_argument(
            "file",
            metavar="FILE",
            help="JSON lines, one schedule a line, as 'schedules list --json' prints them "
            "(- : standard input)",
        )
    for action, what in (("add", "store a schedule"), ("update", "change a stored schedule")):
        parser = actions.add_parser(action, help=what)
        common(parser)
        parser.add_argument("name", metavar="NAME", help="the schedule's (and its job's) name")
        if action == "add":
            parser.add_argument("task", metavar="TASK", help="the task it runs (@scheduler.task)")
        else:
            parser.add_argument("--task", help="the task it runs from now on")
        kind = parser.add_mutually_exclusive_group(required=action == "add")
        kind.add_argument("--cron", metavar="EXPR", help="a cron expression ('0 8 * * *')")
        kind.add_argument("--every", metavar="SECONDS", type=float, help="an interval")
        kind.add_argument("--at", metavar="ISO", nargs="+", help="once, at these instants")
        parser.add_argument("--seconds", action="store_true", help="--cron has a seconds field")
        parser.add_argument("--tz", help="the zone of --cron (default: UTC)")
        parser.add_argument("--anchor", metavar="ISO", help="one slot of --every (the phase)")
        parser.add_argument("--kwargs", metavar="JSON", help="the task's keyword arguments")
        parser.add_argument(
            "--option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a job option (timeout=600, overlap=queue, tags='[\"a\"]', "
            "stop_at=2027-01-01T00:00:00+00:00...; the value is JSON or text; repeatable)",
        )
    remove = actions.add_parser("remove", help="remove a stored schedule")
    common(remove)
    remove.add_argument("name", metavar="NAME", help="the schedule's name")


def _grants(args: argparse.Namespace) -> int:
    """Print the grants (no connection: the ledger's owner runs them)."""
    try:
        from ..postgres._sql.grants import ROLES, grant_statements
        from ..postgres._sql.tables import DEFAULT_TABLE, LedgerTable
    except ImportError:
        raise CronlockError(
            "grants needs asyncpg: pip install 'cronlock[postgres]' "
            "(from a clone, until cronlock is on PyPI: pip install -e '.[postgres]')"
        ) from None
    table = LedgerTable(args.table or DEFAULT_TABLE, args.schema)
    chosen = {part: getattr(args, part) for part in ROLES if getattr(args, part)}
    for name in (table.table, table.schema or "", *chosen.values()):
        # A line break in a name would end a comment line and start a statement.
        if any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise CronlockError(f"grants: a name with a control character: {name!r}")
    if not chosen:
        raise CronlockError("grants: every role was left out ('')")
    print(f"-- the grants on the run ledger {table.runs}, as its owner prints them:")
    print("-- each role needs CONNECT on the database too (and no other right)")
    for line in grant_statements(table, chosen, mode=args.mode, keyed=args.keyed):
        print(line)
    return 0


def run_pg(args: argparse.Namespace) -> int:
    """Run one of the ledger verbs; errors are raised as :class:`CronlockError`."""
    if args.verb == "grants":
        return _grants(args)
    # Where the DSN comes from, for error messages ("with --dsn"): never the DSN itself.
    from_env = DSN_ENV if os.environ.get(DSN_ENV) else "the PG* variables"
    args.dsn_source = "--dsn" if args.dsn else from_env
    try:
        args.dsn = cli_dsn(args.dsn)
    except ValueError as exc:
        raise CronlockError(str(exc)) from None
    if args.verb == "web":
        try:
            # The dashboard's extra: Starlette, Jinja2 and uvicorn (and asyncpg).
            from ..web._serve import serve
        except ImportError:
            raise CronlockError(
                "web needs the web extra: pip install 'cronlock[web]' "
                "(from a clone, until cronlock is on PyPI: pip install -e '.[web]')"
            ) from None
        return serve(args)
    try:
        # cronlock.postgres refuses to import without asyncpg, its one extra dependency.
        from ..postgres._ops.cli import run_verb
    except ImportError:
        raise CronlockError(
            f"{args.verb} needs asyncpg: pip install 'cronlock[postgres]' "
            "(from a clone, until cronlock is on PyPI: pip install -e '.[postgres]')"
        ) from None
    return run_verb(args)
