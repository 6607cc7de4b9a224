"""The Celery app of the beat tests: its beat and its workers run as real processes.

Configured by the environment the test gives each process: ``CL_BROKER`` (the broker's
URL), ``CL_QUEUE`` (a queue name of the test's own, also the Redis key prefix),
``CL_ENTRIES`` entries named ``e0``, ``e1``, ... every ``CL_INTERVAL`` seconds, the ledger
``CL_LEDGER`` in mode ``CL_MODE`` on ``$CRONLOCK_DSN``. A worker appends one JSON line per
task it executes to ``CL_RECORDS/worker-<pid>.jsonl``: the task's id, its entry, the slot
and attempt the beat put in its headers, and whether the broker said it was redelivered.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

QUEUE = os.environ.get("CL_QUEUE", "cronlock-test")
ENTRIES = int(os.environ.get("CL_ENTRIES", "0"))
INTERVAL = float(os.environ.get("CL_INTERVAL", "1"))
RECORDS = os.environ.get("CL_RECORDS", "")
METRICS = os.environ.get("CL_METRICS_PORT")

app = Celery("celery_proj", broker=os.environ.get("CL_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=QUEUE,
    # Redis: every key of this test under its own prefix (removed by the test).
    broker_transport_options={"global_keyprefix": f"{QUEUE}:"},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    enable_utc=True,
    timezone="UTC",
    cronlock_ledger=os.environ.get("CL_LEDGER", "cronlock_runs"),
    cronlock_mode=os.environ.get("CL_MODE", "session"),
    cronlock_metrics_port=int(METRICS) if METRICS else None,
    beat_schedule={
        f"e{i}": {"task": "cronlock_test.record", "schedule": INTERVAL, "args": (f"e{i}",)}
        for i in range(ENTRIES)
    },
)


@app.task(name="cronlock_test.record", bind=True)  # type: ignore[untyped-decorator]
def record(self: Any, entry: str) -> None:
    request = self.request
    line = {
        "id": request.id,
        "entry": entry,
        "slot": getattr(request, "cronlock_slot", None),
        "attempt": getattr(request, "cronlock_attempt", None),
        "send": getattr(request, "cronlock_send", None),
        "redelivered": bool((request.delivery_info or {}).get("redelivered")),
        "worker": os.getpid(),
        "t": time.time(),
    }
    with open(os.path.join(RECORDS, f"worker-{os.getpid()}.jsonl"), "a") as out:
        out.write(json.dumps(line) + "\n")
