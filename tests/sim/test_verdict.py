"""``status --check`` read in the simulation: the verb's own code, on an operator process of
its own, at given virtual instants; what it printed read back as a user reads it."""

from __future__ import annotations

import pytest

from cronlock._sim.faults import Fault, apply
from cronlock._sim.fleet import Fleet, JobSpec
from cronlock._sim.verdict import Reading, Verdicts, parse_status
from cronlock._sim.world import World

PRINTED = """run ledger "sim_runs": 3 job(s); times in UTC
JOB       STATE    SCHEDULE  LAST SUCCESS         LAST FAILURE  NEXT SLOT            LOCK HELD BY
a-job     overdue  every 5s  2026-03-01 09:00:10  -             2026-03-01 09:00:15  -
b         ok       every 1s  2026-03-01 09:00:10  -             2026-03-01 09:00:11  pid 1 sim:r0
long job  absent   -         -                    -             2026-03-01 09:00:15  -
stored schedule x (revision 2): no task 'x' here
overdue: a-job
absent: long job
"""


def test_the_printed_status_reads_back_per_job() -> None:
    states, check = parse_status(PRINTED)
    assert states == {"a-job": "overdue", "b": "ok", "long job": "absent"}
    assert check == {"a-job": "overdue", "long job": "absent"}
    reading = Reading(1.0, states, check, 1, PRINTED)
    assert reading.verdicts() == {"a-job": "overdue", "b": "ok", "long job": "absent"}
    assert reading.verdict("nobody") == "unknown"


def test_an_empty_ledger_reads_as_no_job() -> None:
    assert parse_status('run ledger "sim_runs": 0 job(s); times in UTC\n') == ({}, {})


def test_status_check_is_read_at_the_instants_asked_for() -> None:
    world = World(5)
    job = JobSpec("tick", "every:5", 0.2, {"alert_after": 10})
    fleet = Fleet(world, mode="session", replicas=1, jobs=(job,))
    apply(Fault("stop", 12.0), fleet)
    verdicts = Verdicts(fleet, (8.0, 27.0))
    fleet.run(12.0, quiet=20.0)
    assert [r.at for r in verdicts.readings] == [8.0, 27.0]
    running, gone = verdicts.readings
    # Running: the job is ok and the check passes; gone 15 s: the slot of 15 s did not run.
    assert running.verdict("tick") == "ok" and running.status == 0, running.output
    assert gone.verdict("tick") == "overdue" and gone.status == 1, gone.output
    assert gone.states == {"tick": "overdue"}
    assert not world.errors


@pytest.mark.parametrize("spec", [True, False])
def test_a_note_that_owes_nothing_is_judged_by_the_spec_or_the_oracle_says_so(
    spec: bool,
) -> None:
    # E4's proximate cause, staged by hand: once the fleet is gone its job's note says the
    # next slot is the last one that succeeded. With the job's spec the verdict rebuilds the
    # slot after it and finds it owed; without (a note an older cronlock wrote), status
    # --check finds nothing owed, and the oracle says so.
    from cronlock._sim.oracle import JobView, judge

    world = World(5)
    job = JobSpec("tick", "every:5", 0.2, {"alert_after": 10})
    fleet = Fleet(world, mode="lease", replicas=1, jobs=(job,))
    apply(Fault("stop", 12.0), fleet)

    def owe_nothing() -> None:
        db = world.server.db
        db.begin(world.at(20.0))
        kept = {} if spec else {"spec": None}
        db.update("jobs", "tick", next_run=world.at(10.0), due=world.at(10.0), **kept)
        db.commit()

    world.call_at(20.0, owe_nothing)
    verdicts = Verdicts(fleet, (27.0, 42.0))
    fleet.run(12.0, quiet=35.0)
    if spec:
        assert [r.verdict("tick") for r in verdicts.readings] == ["overdue", "overdue"]
        return
    assert [r.verdict("tick") for r in verdicts.readings] == ["ok", "ok"]
    judged = judge(
        jobs=(JobView("tick", "every:5", alert_after=10.0),),
        epoch=world.epoch,
        window=(3.0, 12.0),
        settled=world.now,
        effects=fleet.effects,
        said=fleet.said,
        ledger=fleet.ledger,
        disruptions=(),
        gone={},
        readings=[(r.at, r.verdicts()) for r in verdicts.readings],
        fleet_gone=fleet.replicas[0].stopped_at,
    )
    assert [v.rule for v in judged.violations] == ["gone-ok", "gone-ok"]
