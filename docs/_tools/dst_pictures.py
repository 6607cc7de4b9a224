"""Draw the DST pictures of docs/guides/schedules.md from cronlock's own slot maths.

    python docs/_tools/dst_pictures.py           # (re)write docs/images/dst-*.svg
    python docs/_tools/dst_pictures.py --check   # exit 1 if a committed picture is stale

Each picture is one night in Europe/Berlin around a DST change, drawn on a real-time axis
(UTC): the wall clock under it, the hour that is skipped or repeated, and the slots that
``cron(expr, tz="Europe/Berlin").next_after`` gives for a fixed-time job and for a wildcard
job. The SVG is written by hand (no plotting library): the output is plain text, the same
on every machine, so a test can compare it with the committed files.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from xml.sax.saxutils import escape
from zoneinfo import ZoneInfo

from cronlock import cron

ZONE = ZoneInfo("Europe/Berlin")
IMAGES = Path(__file__).resolve().parent.parent / "images"

LEFT, RIGHT, PX_PER_HOUR = 260, 50, 130
TOP = 64
ROW = 58
INK, MUTED, GAP, REPEAT_1, REPEAT_2 = "#1f2933", "#7b8794", "#e12d39", "#cfe8ff", "#ffe3c2"


@dataclass(frozen=True)
class Night:
    """One picture: a window of real time and what to say about it."""

    file: str
    title: str
    start: datetime  # UTC, a local midnight
    hours: int
    rows: tuple[tuple[str, str], ...]  # (cron expression, label)


NIGHTS = (
    Night(
        file="dst-spring-forward.svg",
        title="Spring forward: Sunday 29 March 2026, Europe/Berlin (02:00 CET becomes 03:00 CEST)",
        start=datetime(2026, 3, 28, 23, 0, tzinfo=UTC),
        hours=5,
        rows=(
            ("30 2 * * *", "fixed time: once, right after the gap"),
            ("*/30 * * * *", "wildcard: real-time cadence kept"),
        ),
    ),
    Night(
        file="dst-fall-back.svg",
        title="Fall back: Sunday 25 October 2026, Europe/Berlin (03:00 CEST becomes 02:00 CET)",
        start=datetime(2026, 10, 24, 22, 0, tzinfo=UTC),
        hours=6,
        rows=(
            ("30 2 * * *", "fixed time: once, first pass"),
            ("*/30 * * * *", "wildcard: both passes run"),
        ),
    ),
)


def slots(expr: str, start: datetime, end: datetime) -> list[datetime]:
    """The job's slots in [start, end), from cronlock's schedule."""
    schedule = cron(expr, tz=ZONE)
    found: list[datetime] = []
    slot = schedule.next_after(start - timedelta(microseconds=1))
    while slot is not None and slot < end:
        found.append(slot)
        slot = schedule.next_after(slot)
    return found


def wall(t: datetime) -> str:
    local = t.astimezone(ZONE)
    return f"{local:%H:%M} {local.tzname()}"


def transitions(start: datetime, end: datetime) -> list[datetime]:
    """Instants in the window where the zone's UTC offset changes (minute resolution)."""
    found = []
    t = start
    while t < end:
        after = t + timedelta(minutes=1)
        if t.astimezone(ZONE).utcoffset() != after.astimezone(ZONE).utcoffset():
            found.append(after)
        t = after
    return found


def draw(night: Night) -> str:
    end = night.start + timedelta(hours=night.hours)
    width = LEFT + night.hours * PX_PER_HOUR + RIGHT
    axis_y = TOP + 30
    first_row = axis_y + 78
    height = first_row + ROW * len(night.rows) + 20

    def x(t: datetime) -> float:
        return LEFT + (t - night.start).total_seconds() / 3600 * PX_PER_HOUR

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
        f'font-size="13" role="img">',
        f"<title>{escape(night.title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="16" y="26" font-size="15" font-weight="bold" fill="{INK}">'
        f"{escape(night.title)}</text>",
    ]
    change = transitions(night.start, end)[0]
    offset_before = (change - timedelta(minutes=1)).astimezone(ZONE).utcoffset() or timedelta()
    offset_after = change.astimezone(ZONE).utcoffset() or timedelta()
    if offset_after > offset_before:  # spring forward: a wall-clock hour that never happens
        cx = x(change)
        out.append(
            f'<line x1="{cx}" y1="{TOP - 8}" x2="{cx}" y2="{height - 12}" stroke="{GAP}" '
            f'stroke-width="2" stroke-dasharray="5,4"/>'
        )
        # The wall clock reads this just before the change, and jumps past an hour.
        before = (change + offset_before).replace(tzinfo=None)
        out.append(
            f'<text x="{cx + 6}" y="{TOP}" fill="{GAP}">wall clock jumps '
            f"{before:%H:%M} → {change.astimezone(ZONE):%H:%M}: "
            f"{before:%H}:00–{before:%H}:59 never happens</text>"
        )
    else:  # fall back: one wall-clock hour happens twice
        repeat = offset_before - offset_after
        for a, b, fill, text in (
            (change - repeat, change, REPEAT_1, "first pass (CEST)"),
            (change, change + repeat, REPEAT_2, "second pass (CET)"),
        ):
            out.append(
                f'<rect x="{x(a)}" y="{TOP - 14}" width="{x(b) - x(a)}" '
                f'height="{height - TOP + 2}" fill="{fill}"/>'
            )
            out.append(f'<text x="{x(a) + 6}" y="{TOP}" fill="{INK}">{text}</text>')
    # Two time axes: real time (UTC) above, the Berlin wall clock below it.
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{x(end)}" y2="{axis_y}" stroke="{INK}"/>')
    out.append(f'<text x="16" y="{axis_y - 8}" fill="{INK}">real time (UTC)</text>')
    out.append(f'<text x="16" y="{axis_y + 30}" fill="{INK}">Berlin wall clock</text>')
    for h in range(night.hours + 1):
        t = night.start + timedelta(hours=h)
        out.append(
            f'<line x1="{x(t)}" y1="{axis_y - 5}" x2="{x(t)}" y2="{axis_y + 5}" stroke="{INK}"/>'
        )
        out.append(
            f'<text x="{x(t)}" y="{axis_y - 8}" text-anchor="middle" fill="{INK}">{t:%H:%M}</text>'
        )
        out.append(
            f'<text x="{x(t)}" y="{axis_y + 30}" text-anchor="middle" fill="{MUTED}">'
            f"{escape(wall(t))}</text>"
        )
    for i, (expr, label) in enumerate(night.rows):
        y = first_row + i * ROW
        out.append(
            f'<text x="16" y="{y - 4}" font-family="monospace" font-weight="bold" '
            f'fill="{INK}">{escape(expr)}</text>'
        )
        out.append(f'<text x="16" y="{y + 13}" fill="{MUTED}">{escape(label)}</text>')
        out.append(
            f'<line x1="{LEFT}" y1="{y}" x2="{x(end)}" y2="{y}" stroke="{MUTED}" '
            f'stroke-dasharray="2,3"/>'
        )
        for slot in slots(expr, night.start, end):
            out.append(f'<circle cx="{x(slot)}" cy="{y}" r="6" fill="{INK}"/>')
            local = slot.astimezone(ZONE)
            out.append(
                f'<text x="{x(slot)}" y="{y + 22}" text-anchor="middle" font-size="11" '
                f'fill="{INK}">{local:%H:%M}</text>'
            )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for night in NIGHTS:
        path = IMAGES / night.file
        svg = draw(night)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != svg:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(svg, encoding="utf-8")
    if stale:
        print("stale (run python docs/_tools/dst_pictures.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
