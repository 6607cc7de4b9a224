"""The command line: ``python -m cronlock next|demo|migrate|status|history|celery-beat ...``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from .._clock import SystemClock
from .._errors import CronlockError, LedgerUnreadable, ScheduleError
from .._schedules.schedule import Schedule
from .._schedules.tz import resolve_tz
from .._terminal import printable

__all__ = ("EXIT_CHECK", "EXIT_OK", "EXIT_UNREADABLE", "EXIT_USAGE", "main")

EXIT_OK = 0
"""The verb did what it was asked."""
EXIT_CHECK = 1
"""``status --check`` found jobs overdue, absent or rejected; or a job named is unknown, or a
change was refused (the message says which)."""
EXIT_USAGE = 2
"""The command line or its input is wrong (an unknown option, a bad value, JSON nested too
deeply): nothing was done."""
EXIT_UNREADABLE = 3
"""The run ledger could not be used: a privilege is missing (named), the ledger or its
schema is missing or older, or the server is down or failed."""

# `next -n` beyond this is a mistake rather than a question (and takes seconds to answer).
MAX_SLOTS = 10_000
_END_OF_CALENDAR = "9999-12-31 23:59:59 UTC"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line and exit status 2, like argparse, without the usage block.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cronlock")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from .. import __version__

        return __version__


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cronlock", description="cronlock command line")
    parser.add_argument("--version", action="version", version=f"cronlock {_version()}")
    # The internal `_replica` verb of the demo is dispatched in main() before this parser is
    # built, so help and usage list only the public verbs.
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    nxt = verbs.add_parser("next", help="print the upcoming slots of a cron expression")
    nxt.add_argument("expr", help='a cron expression, e.g. "0 3 * * *" or @daily')
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default: UTC)")
    nxt.add_argument(
        "-n", type=int, default=5, help=f"how many slots, 1 to {MAX_SLOTS} (default: 5)"
    )
    nxt.add_argument("--seconds", action="store_true", help="6 fields, seconds first")
    nxt.add_argument(
        "--after",
        help="ISO 8601 date and time to start from (default: now); without an offset "
        "it is a wall time in --tz, e.g. 2026-03-29T01:00",
    )

    from .demo import add_demo_parser

    add_demo_parser(verbs)
    from .ledger import add_pg_parsers

    add_pg_parsers(verbs)
    from .celery_beat import add_celery_parser

    add_celery_parser(verbs)
    return parser


def _schedule(args: argparse.Namespace, zone: ZoneInfo) -> Schedule:
    from .._stored.json import schedule_from_text

    try:
        schedule = schedule_from_text(cron=args.expr, seconds=args.seconds, tz=zone)
    except ScheduleError as exc:
        # The library's hint names its keyword argument; here the switch is --seconds.
        message = str(exc).replace("pass seconds=True", "pass --seconds")
        if args.seconds and "expected 6 fields" in message:
            message += "; leave out --seconds for 5 fields"
        raise CronlockError(message) from None
    assert schedule is not None  # a cron expression was given
    return schedule


def _after(text: str, zone: ZoneInfo) -> datetime:
    """``--after`` as aware UTC; without an offset it is a wall time in *zone*."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CronlockError(
            f"--after: {text!r} is not an ISO 8601 date and time "
            "(e.g. 2026-03-29T01:00, 2026-03-29T01:00+02:00 or 2026-03-29T01:00Z)"
        ) from None
    if value.tzinfo is None:
        # A wall time in a repeated hour is its first pass, one in a DST gap is read with
        # the offset from before the gap (PEP 495, fold=0), as zoneinfo does.
        value = value.replace(tzinfo=zone)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise CronlockError(
            f"--after: {text!r} in {zone.key} is outside the calendar (years 1 to 9999)"
        ) from None


# Schedules look a day or two ahead (DST changes), so near the end they stop early.
_LAST_DAYS = datetime(9999, 12, 29, tzinfo=UTC)


def _slots(schedule: Schedule, after: datetime, n: int) -> tuple[list[datetime], str | None]:
    """Up to *n* slots after *after*, and why there are fewer, if there are."""
    slots: list[datetime] = []
    current = after
    while len(slots) < n:
        try:
            slot = schedule.next_after(current)
        except (OverflowError, ValueError) as exc:
            if isinstance(exc, CronlockError):
                raise
            # datetime arithmetic raises these only past year 9999 (some schedules give up
            # a day early: they look ahead for DST changes).
            shown = current.strftime("%Y-%m-%d %H:%M:%S")
            return slots, (
                f"stopped: no slot after {shown} UTC can be computed "
                f"(the calendar ends at {_END_OF_CALENDAR})"
            )
        if slot is None:
            shown = current.strftime("%Y-%m-%d %H:%M:%S")
            if current > _LAST_DAYS:
                # Within the look-ahead of the calendar's end: "none" may mean "none left".
                return slots, (
                    f"stopped: no slot after {shown} UTC can be computed "
                    f"(the calendar ends at {_END_OF_CALENDAR})"
                )
            return slots, f"stopped: the schedule has no slot after {shown} UTC"
        slots.append(slot)
        current = slot
    return slots, None


def _cmd_next(args: argparse.Namespace) -> int:
    if not 1 <= args.n <= MAX_SLOTS:
        raise CronlockError(f"-n must be between 1 and {MAX_SLOTS}, got {args.n}")
    zone = resolve_tz(args.tz, field="--tz")
    schedule = _schedule(args, zone)
    after = SystemClock().now() if args.after is None else _after(args.after, zone)
    slots, stopped = _slots(schedule, after, args.n)
    fmt = "%Y-%m-%d %H:%M:%S" if args.seconds else "%Y-%m-%d %H:%M"
    print(f"next {len(slots)} slot(s) of {args.expr!r} in {zone.key}:")
    for slot in slots:
        local = slot.astimezone(zone)
        print(
            f"  {local.strftime(fmt)} {local.strftime('%Z'):<6} ({local.strftime('%z')})"
            f"  =  {slot.strftime(fmt)} UTC"
        )
    if stopped is not None:
        print(stopped)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        if arguments[:1] == ["_replica"]:  # one child process of `demo`; not a public verb
            from .demo import replica_main

            return replica_main(arguments[1:])
        args = _build_parser().parse_args(arguments)
        if args.verb == "next":
            return _cmd_next(args)
        if args.verb == "celery-beat":
            from .celery_beat import run_celery_beat

            return run_celery_beat(args)
        from .ledger import PG_VERBS, run_pg

        if args.verb in PG_VERBS:
            return run_pg(args)
        from .demo import run_demo

        return run_demo(args)
    except CronlockError as exc:
        # Escaped: an error may quote the ledger's text (a job's name, a server's answer).
        print(f"cronlock: error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_UNREADABLE if isinstance(exc, LedgerUnreadable) else EXIT_USAGE
    except RecursionError:
        # Input nested deeper than Python's parsers go (JSON of 1,000 levels, say): bad input.
        print("cronlock: error: the input is nested too deeply", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`status | head`): what it did not read is not an error.
        # Further writes (the interpreter's flush at exit) go nowhere instead of raising.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # as a shell reports a process ended by SIGPIPE
