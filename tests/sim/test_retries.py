"""A pending retry is the fleet's, not its replica's: in the simulation, on a virtual clock.

Two replicas race for one slot of ``flaky`` (``retries=2``); the one that ran attempt 1 is
killed (its sessions end as the kernel closes them) or stopped (a graceful close) during
its backoff, and the other makes the remaining attempts: ``1 + retries`` in all, each once
fleet-wide. The statements behind it have their agreement tests against the real server
(``test_statements_claims.py``, ``test_statements_upkeep.py``); one case runs with real
replica processes and a real SIGKILL (``tests/postgres/test_durable_retries.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock._sim.fleet import Fleet, JobSpec, Mode
from cronlock._sim.world import World

SLOT_AT = 20.0  # seconds into the run: both replicas are up long before
BACKOFF = 6.0  # retry_delay: attempt 2 is due 3 to 6 s after attempt 1 failed


def _left_behind(
    mode: Mode, *, fails: int, kill: bool
) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    """Run it; the attempts' starts (replica, attempt) and the ledger's rows of the job."""
    job = JobSpec("flaky", "every:3600", 0.2, {"retries": 2, "retry_delay": BACKOFF}, fails)
    # The world begins SLOT_AT s before an hour: the job's one slot in the run.
    world = World(47, epoch=datetime(2026, 3, 1, 9, tzinfo=UTC) - timedelta(seconds=SLOT_AT))
    fleet = Fleet(world, mode=mode, replicas=2, jobs=(job,))

    def goes() -> None:  # in the backoff: attempt 1 has ended, attempt 2 is not due yet
        [first] = [e.replica for e in fleet.effects if e.kind == "end" and e.attempt == 1]
        [replica] = [r for r in fleet.replicas if r.name == first]
        if kill:
            world.kill(replica.process)
        else:
            replica.process.loop.call_soon(replica.stop.set)

    world.call_at(SLOT_AT + 1.0, goes)
    fleet.run(SLOT_AT + 60.0)
    starts = [(e.replica, e.attempt) for e in fleet.effects if e.kind == "start"]
    rows = [row for row in fleet.ledger if row["job"] == "flaky"]
    return starts, rows


@pytest.mark.parametrize("mode", ["session", "lease"])
def test_a_replica_killed_during_its_backoff_leaves_its_retries_to_another(mode: Mode) -> None:
    starts, [row] = _left_behind(mode, fails=3, kill=True)
    first = starts[0][0]
    other = "r1" if first == "r0" else "r0"
    # Exactly 1 + retries attempts fleet-wide: the first by the replica killed, the two
    # retries by the other (its own retry after attempt 2 as usual).
    assert starts == [(first, 1), (other, 2), (other, 3)]
    assert (row["attempt"], row["outcome"]) == (3, "failed")


@pytest.mark.parametrize("mode", ["session", "lease"])
def test_a_replica_stopped_during_its_backoff_leaves_its_retry_to_another(mode: Mode) -> None:
    starts, [row] = _left_behind(mode, fails=1, kill=False)
    first = starts[0][0]
    other = "r1" if first == "r0" else "r0"
    assert starts == [(first, 1), (other, 2)]
    assert (row["attempt"], row["outcome"]) == (2, "succeeded")
