"""``python -m cronlock schedules list|add|update|remove|put|sync``: the stored schedules
from the command line, through :class:`~cronlock.postgres.FleetControl`'s verbs (the same
checks, the same messages); ``put`` and ``sync`` read JSON lines
(:mod:`cronlock._stored.lines`), which ``list --json`` prints."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..._errors import CronlockError, LockError
from ..._schedules.schedule import Schedule
from ..._stored.json import options_from_json, schedule_from_text
from ..._stored.lines import read_lines, schedule_line
from ..._stored.schedule import StoredSchedule
from ..._terminal import printable
from .._conn.errors import lock_not_available
from .._sql.tables import LedgerTable
from .bulk import ScheduleChanges
from .control import FleetControl

__all__ = ("run_schedules",)

# The parser's fields as this command's user types them, for its messages.
_FLAGS = {"every": "--every", "anchor": "--anchor", "at": "--at"}


def _schedule(args: argparse.Namespace) -> Schedule | None:
    return schedule_from_text(
        cron=args.cron,
        seconds=args.seconds,
        tz=args.tz,
        every=args.every,
        anchor=args.anchor,
        at=args.at,
        labels=_FLAGS,
    )


def _options(given: list[str]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for item in given:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise CronlockError(f"--option: expected NAME=VALUE, got {item!r}")
        try:
            data[name] = json.loads(text)
        except ValueError:
            data[name] = text  # plain text: overlap=queue
    unknown = {name: value for name, value in data.items() if name not in options_from_json(data)}
    return {**unknown, **options_from_json(data)}  # the unknown ones for add's message


def _kwargs(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CronlockError(f"--kwargs: not JSON ({exc})") from None
    except RecursionError:
        raise CronlockError("--kwargs: nested too deeply") from None
    if not isinstance(value, dict):
        raise CronlockError(f"--kwargs: expected a JSON object, got {text!r}")
    return value


def _unusable(exc: BaseException) -> bool:
    """Whether a change failed because the ledger could not be used (a privilege, the
    server), not refused: a change that found the schedules' lock held is refused (exit
    status 1, "try again"), as the verbs' other refusals are."""
    return isinstance(exc, LockError) and not lock_not_available(exc.__cause__ or exc)


def _line(stored: StoredSchedule) -> list[str]:
    options = ", ".join(f"{k}={v}" for k, v in sorted(stored.options.items()))
    problem = stored.problem or "-"
    return [
        stored.name,
        stored.task,
        str(stored.schedule),
        json.dumps(dict(stored.kwargs), sort_keys=True),
        options or "-",
        "paused" if stored.paused else "-",
        str(stored.revision),
        problem,
    ]


def _show(header: list[str], rows: list[list[str]]) -> None:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


async def run_schedules(args: argparse.Namespace, table: LedgerTable) -> int:
    """Run ``schedules ACTION``; a refused change exits 1 with the verb's message."""
    async with FleetControl(args.dsn, table=table.table, schema=table.schema) as control:
        if args.action == "list" and args.json:
            for stored_one in await control.schedules():
                print(schedule_line(stored_one))
            return 0
        if args.action in ("put", "sync"):
            return await _bulk(args, control)
        if args.action == "list":
            stored = await control.schedules()
            print(f"{len(stored)} stored schedule(s) in {table.schedules}")
            if stored:
                header = ["NAME", "TASK", "SCHEDULE", "KWARGS", "OPTIONS", "PAUSED", "REV"]
                _show([*header, "PROBLEM"], [_line(s) for s in stored])
            return 0
        try:
            if args.action == "remove":
                if not await control.remove_schedule(args.name):
                    print(f"unknown schedule: {args.name}", file=sys.stderr)
                    return 1
                print(printable(f"{args.name}: removed; replicas drop it at their next sync"))
                return 0
            schedule, kwargs, options = _schedule(args), _kwargs(args.kwargs), _options(args.option)
            if args.action == "add":
                if schedule is None:  # (argparse requires one)
                    raise CronlockError("add: give --cron, --every or --at")
                done = await control.add_schedule(
                    args.name, args.task, schedule, kwargs=kwargs, **options
                )
            else:
                done = await control.update_schedule(
                    args.name, task=args.task, schedule=schedule, kwargs=kwargs, **options
                )
        except (CronlockError, KeyError) as exc:
            if _unusable(exc):
                raise  # the ledger could not be used (a privilege, the server): exit status 3
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(printable(str(text)), file=sys.stderr)
            return 1
        print(printable(f"{done.name}: stored as revision {done.revision} ({done.schedule})"))
        return 0


def _read(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.readlines()
    try:
        with open(path, encoding="utf-8") as file:
            return file.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CronlockError(f"{path}: cannot read it ({exc})") from None


def _said(done: ScheduleChanges) -> str:
    counts = f"{done.added} added, {done.updated} updated, "
    counts += f"{done.removed} removed, " if done.removed else ""
    counts += f"{done.unchanged} unchanged"
    if done.revision is None:
        return f"{counts}: nothing to change"
    return f"{counts}: stored as revision {done.revision}; replicas pick it up at their next sync"


async def _bulk(args: argparse.Namespace, control: FleetControl) -> int:
    """``schedules put FILE`` and ``schedules sync --prefix P FILE``: refused whole (exit
    1, naming the line or the schedule) or done in one transaction."""
    source = "standard input" if args.file == "-" else args.file
    try:
        schedules = read_lines(_read(args.file), source=source)
        if args.action == "put":
            done = await control.put_schedules(schedules)
        else:
            done = await control.sync_schedules(args.prefix, schedules)
    except CronlockError as exc:
        if _unusable(exc):
            raise  # the ledger could not be used (a privilege, the server): exit status 3
        print(printable(str(exc)), file=sys.stderr)
        return 1
    print(printable(f"{source}: {len(schedules)} schedule(s): {_said(done)}"))
    return 0
