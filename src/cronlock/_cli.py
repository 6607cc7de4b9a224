"""The command line: ``python -m cronlock next|demo|migrate|status|history ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime

from ._clock import SystemClock
from ._errors import CronlockError
from ._schedule import upcoming
from ._tz import resolve_tz, to_utc

__all__ = ("main",)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line and exit status 2, like argparse, without the usage block.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cronlock", description="cronlock command line")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    nxt = verbs.add_parser("next", help="print the upcoming slots of a cron expression")
    nxt.add_argument("expr", help='a cron expression, e.g. "0 3 * * *" or @daily')
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default: UTC)")
    nxt.add_argument("-n", type=int, default=5, help="how many slots (default: 5)")
    nxt.add_argument("--seconds", action="store_true", help="6 fields, seconds first")
    nxt.add_argument("--after", help="ISO 8601 instant to start from (default: now)")

    from ._demo import add_demo_parser

    add_demo_parser(verbs)
    from ._cli_ledger import add_pg_parsers

    add_pg_parsers(verbs)
    return parser


def _cmd_next(args: argparse.Namespace) -> int:
    from ._cron import cron

    if args.n < 1:
        raise CronlockError(f"-n must be at least 1, got {args.n}")
    zone = resolve_tz(args.tz, field="--tz")
    schedule = cron(args.expr, seconds=args.seconds, tz=zone)
    if args.after:
        try:
            after = to_utc(datetime.fromisoformat(args.after), field="--after")
        except ValueError as exc:
            raise CronlockError(f"--after: {exc}") from None
    else:
        after = SystemClock().now()
    slots = upcoming(schedule, after, args.n)
    fmt = "%Y-%m-%d %H:%M:%S" if args.seconds else "%Y-%m-%d %H:%M"
    print(f"next {len(slots)} slot(s) of {args.expr!r} in {zone.key}:")
    for slot in slots:
        local = slot.astimezone(zone)
        print(
            f"  {local.strftime(fmt)} {local.strftime('%Z'):<6} ({local.strftime('%z')})"
            f"  =  {slot.strftime(fmt)} UTC"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        if args.verb == "next":
            return _cmd_next(args)
        from ._cli_ledger import PG_VERBS, run_pg

        if args.verb in PG_VERBS:
            return run_pg(args)
        from ._demo import run_demo

        return run_demo(args)
    except CronlockError as exc:
        print(f"cronlock: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
