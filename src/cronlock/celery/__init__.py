"""A Celery beat that can run as many replicas: each slot's task sent once across them all.

``celery -A proj beat -S cronlock.celery.BeatScheduler`` (Celery's beat process), or
``python -m cronlock celery-beat -A proj`` (the same without it), on as many replicas as
you like. The run ledger in PostgreSQL decides which replica sends each slot's task;
docs/guides/celery-beat.md says how, what is guaranteed and what is refused.

Needs the ``celery`` extra: ``pip install 'cronlock[celery]'`` (from a clone:
``pip install -e '.[celery]'``). Names are loaded on first use (PEP 562 ``__getattr__``):
``from cronlock.celery import task_id`` (a worker checking an id) imports no more than it
needs.
"""

import importlib as _importlib
import importlib.util as _importlib_util
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

# Fail here, with instructions, rather than deeper inside (found, not imported: cheap).
for _needed in ("celery", "asyncpg"):
    if _importlib_util.find_spec(_needed) is None:  # pragma: no cover - only without the extra
        raise ImportError(
            f"cronlock.celery needs {_needed}, which is not installed; install the extra "
            "with: pip install 'cronlock[celery]' (from a clone of the repository, until "
            "cronlock is on PyPI: pip install -e '.[celery]')"
        )

if _TYPE_CHECKING:
    from ._beat import BeatScheduler as BeatScheduler
    from ._entries import BeatEntry as BeatEntry
    from ._entries import EntryOptions as EntryOptions
    from ._entries import beat_entries as beat_entries
    from ._entries import convert_entry as convert_entry
    from ._ids import TASK_ID_NAMESPACE as TASK_ID_NAMESPACE
    from ._ids import task_id as task_id
    from ._runner import ATTEMPT_HEADER as ATTEMPT_HEADER
    from ._runner import SEND_HEADER as SEND_HEADER
    from ._runner import SLOT_HEADER as SLOT_HEADER
    from ._runner import beat_scheduler as beat_scheduler
    from ._runner import run_beat as run_beat
    from ._settings import BeatSettings as BeatSettings

# Where each public name lives (its module is imported on first access).
_WHERE = {
    "BeatScheduler": "._beat",
    "BeatEntry": "._entries",
    "EntryOptions": "._entries",
    "beat_entries": "._entries",
    "convert_entry": "._entries",
    "TASK_ID_NAMESPACE": "._ids",
    "task_id": "._ids",
    "ATTEMPT_HEADER": "._runner",
    "SEND_HEADER": "._runner",
    "SLOT_HEADER": "._runner",
    "beat_scheduler": "._runner",
    "run_beat": "._runner",
    "BeatSettings": "._settings",
}

__all__ = (
    "ATTEMPT_HEADER",
    "SEND_HEADER",
    "SLOT_HEADER",
    "TASK_ID_NAMESPACE",
    "BeatEntry",
    "BeatScheduler",
    "BeatSettings",
    "EntryOptions",
    "beat_entries",
    "beat_scheduler",
    "convert_entry",
    "run_beat",
    "task_id",
)


def __getattr__(name: str) -> _Any:
    """Import the module defining *name* on first access, then keep the name here."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'cronlock.celery' has no attribute {name!r}")
    value = getattr(_importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
