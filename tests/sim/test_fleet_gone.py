"""A fleet that is gone is never ``ok`` (issue 36), in the simulation, on a virtual clock:
whenever in a slot's period the fleet stopped (gracefully) or was killed (SIGKILL), its
job turns ``overdue`` (or ``absent``) and ``status --check`` fails on it, in both modes.

Each run is one replica with one job (every 2 s, ``alert_after=1``); the fleet goes at one
of five instants spread over a period, and an operator runs ``status --check`` (the verb's
own code, :mod:`cronlock._sim.verdict`) a few seconds, half a minute and past
``ABSENT_AFTER`` after. The oracle's ``gone-ok`` rule judges the readings too. The
real-process, real-server case is ``tests/postgres/test_fleet_verdict.py``.
"""

from __future__ import annotations

import pytest

from cronlock._sim.faults import Fault, apply
from cronlock._sim.fleet import Fleet, JobSpec, Mode
from cronlock._sim.verdict import Verdicts
from cronlock._sim.world import World

PERIOD = 2.0
OFFSETS = 5  # instants spread over a slot's period
GONE_AT = 12.0  # seconds into the run: the job ran a few slots by then
AFTER = (5.0, 30.0, 100.0)  # seconds after the fleet went: status --check read then


@pytest.mark.parametrize("offset", range(OFFSETS))
@pytest.mark.parametrize("how", ["stop", "kill"])
@pytest.mark.parametrize("mode", ["session", "lease"])
def test_a_fleet_that_is_gone_is_never_ok(mode: Mode, how: str, offset: int) -> None:
    at = GONE_AT + PERIOD * offset / OFFSETS
    world = World(21 + offset)
    job = JobSpec("beat", f"every:{PERIOD:g}", 0.01, {"alert_after": 1})
    fleet = Fleet(world, mode=mode, replicas=1, jobs=(job,))
    apply(Fault("stop", at) if how == "stop" else Fault("kill", at, replica=0), fleet)
    verdicts = Verdicts(fleet, [at + after for after in AFTER])
    fleet.run(at, quiet=AFTER[-1] + 5.0)
    assert not world.errors, world.errors
    assert [e.slot for e in fleet.effects if e.kind == "start"], "the job never ran"
    assert [r.at for r in verdicts.readings] == [at + after for after in AFTER]
    for reading in verdicts.readings:  # never ok, and the health check fails naming it
        assert reading.verdict("beat") in {"overdue", "absent"}, reading.output
        assert reading.status == 1, reading.output
    # Past ABSENT_AFTER (90 s) without a note: no live replica runs it.
    assert verdicts.readings[-1].states == {"beat": "absent"}, verdicts.readings[-1].output
