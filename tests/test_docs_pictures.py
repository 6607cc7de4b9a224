"""The DST pictures in docs/images are what cronlock's slot maths draws today.

docs/_tools/dst_pictures.py draws them from ``cron(...).next_after``; if a change to the
schedules moved a slot, the committed pictures would show the old behaviour. Redraw them
with ``python docs/_tools/dst_pictures.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "_tools" / "dst_pictures.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cronlock_docs_dst_pictures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_committed_dst_pictures_are_current() -> None:
    script = _script()
    for night in script.NIGHTS:
        committed = (script.IMAGES / night.file).read_text(encoding="utf-8")
        assert committed == script.draw(night), f"{night.file} is stale: run {SCRIPT}"


def test_each_night_shows_one_run_of_the_fixed_time_job() -> None:
    script = _script()
    for night in script.NIGHTS:
        end = night.start + timedelta(hours=night.hours)
        assert len(script.slots("30 2 * * *", night.start, end)) == 1, night.file
