"""The counting of benchmarks/celery_beat.py on made-up sends: duplicates, missed slots, the
takeover and the longest gap must come out as a reader of its table would count them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "celery_beat.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("cronlock_celery_beat_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _load()
T0 = 1_800_000_000.0  # a whole minute (divisible by 60)
EVERY = {"e0": 1.0, "e1": 1.0}


def beat(name: str, phase: float, period: float, start: float, end: float) -> list[Any]:
    """A beat sending every entry of EVERY each *period* s from start + phase until end."""
    sends, t, n = [], start + phase, 0
    while t < end:
        for entry in EVERY:
            sends.append(bench.Send(entry, t, name, f"{name}-{entry}-{n}"))
        t += period
        n += 1
    return sends


def test_two_beats_send_every_slot_twice() -> None:
    sends = beat("A", 0.2, 1.0, T0, T0 + 30) + beat("B", 0.7, 1.0, T0, T0 + 30)
    t = bench.tally(sends, EVERY, T0, T0 + 30)
    assert (t.due, t.sends, t.sent, t.duplicates, t.missed) == (60, 120, 60, 60, 0)
    assert t.per_beat == {"A": 60, "B": 60}


def test_a_lone_beats_drift_is_not_missed() -> None:
    # celery's interval schedule counts from the last send: a period a little over 1 s
    sends = beat("A", 0.1, 1.05, T0, T0 + 40)
    t = bench.tally(sends, EVERY, T0, T0 + 40)
    assert t.missed == 0 and t.duplicates == 0
    assert t.sent < t.due  # the slot skipped by the drift shows as slots sent < due
    assert t.period_s is not None and abs(t.period_s - 1.05) < 1e-6


def test_a_takeover_counts_the_gap_as_missed() -> None:
    # A sends until it is killed at T0 + 10.5; B takes over from T0 + 16.3
    sends = beat("A", 0.3, 1.0, T0, T0 + 10.5) + beat("B", 6.3, 1.0, T0 + 10, T0 + 30)
    t = bench.tally(sends, EVERY, T0, T0 + 30, kill=(T0 + 10.5, "A"))
    # each entry: last send at 10.3, next at 16.3: a gap of 6 intervals, 5 slots missed
    assert t.missed == 2 * 5
    assert t.duplicates == 0
    assert t.takeover_s is not None and abs(t.takeover_s - 6.0) < 1e-6
    assert t.longest_gap_s is not None and abs(t.longest_gap_s - 6.0) < 1e-6


def test_no_takeover_within_the_window() -> None:
    sends = beat("A", 0.3, 1.0, T0, T0 + 10.5)
    t = bench.tally(sends, EVERY, T0, T0 + 30, kill=(T0 + 10.5, "A"))
    assert t.takeover_s is None
    assert t.missed == 2 * 19  # 10.3 -> the window's end at 30
    assert t.longest_gap_s is not None and abs(t.longest_gap_s - 19.7) < 1e-6


def test_slots_named_by_the_sender_are_counted_exactly() -> None:
    sends = []
    for k in range(20):
        if k in (5, 7):
            continue  # 5 is sent late below, 7 never
        slot = T0 + k
        sends.append(bench.Send("e0", slot + 0.01, "ABC"[k % 3], f"id-{k}", slot))
    # slot 5 sent 3.6 s late (after a replica's loss, within the grace): sent, not missed
    sends.append(bench.Send("e0", T0 + 8.6, "A", "id-5", T0 + 5))
    # slot 12 sent again with the same id (a recovered send), slot 13 with another id
    sends.append(bench.Send("e0", T0 + 12.5, "C", "id-12", T0 + 12))
    sends.append(bench.Send("e0", T0 + 13.4, "B", "other", T0 + 13))
    t = bench.tally(sends, {"e0": 1.0}, T0, T0 + 20)
    assert (t.due, t.sent, t.duplicates, t.missed) == (20, 19, 2, 1)
    assert t.ids_twice == 1


def test_crontab_minutes() -> None:
    cron = {"c0": None, "c1": None}
    start, end = T0 - 30, T0 + 150  # minutes T0, T0 + 60 and T0 + 120 begin inside
    sends = [
        bench.Send("c0", T0 + 0.1, "A", "a"),
        bench.Send("c0", T0 + 0.3, "B", "b"),  # the same minute again
        bench.Send("c0", T0 + 60.1, "A", "c"),
        bench.Send("c0", T0 + 120.1, "A", "d"),
        bench.Send("c1", T0 + 60.2, "A", "e"),
    ]
    t = bench.tally(sends, cron, start, end)
    assert (t.due, t.sent, t.duplicates, t.missed) == (6, 4, 1, 2)


def test_the_table_goes_between_the_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    start, end = bench.MARKERS
    readme.write_text(f"before\n{start}\nold table\n{end}\nafter\n")
    bench.write_readme("new table", readme)
    assert readme.read_text() == f"before\n{start}\nnew table\n{end}\nafter\n"
