"""The named scenarios of this round's findings, in both modes: each passes, or breaks the
promise exactly as ``KNOWN`` says (a strict known failure: one that starts passing, or
breaks it another way, fails here until ``KNOWN`` is brought up to date)."""

from __future__ import annotations

from typing import cast

import pytest

from cronlock._sim.run import Mode, run_plan
from cronlock._sim.scenarios import KNOWN, SCENARIOS, scenario

CASES = [(name, mode) for name, (modes, _) in SCENARIOS.items() for mode in modes]


@pytest.mark.parametrize(("name", "mode"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_scenario(name: str, mode: str) -> None:
    plan = scenario(name, cast(Mode, mode))
    result = run_plan(plan)
    broken = {violation.rule for violation in result.judged.violations}
    lines = "\n".join(v.text() for v in result.judged.violations[:10])
    known = KNOWN.get((name, plan.mode))
    if known is None:
        assert not broken, f"{plan.command()}\n{lines}"
        return
    assert broken, f"{name} ({mode}) passes now: take it out of KNOWN"
    assert broken == known, (
        f"{plan.command()} breaks {sorted(broken)}, KNOWN says {sorted(known)}\n{lines}"
    )
    pytest.xfail(f"known defect: {', '.join(sorted(known))} ({plan.command()})")


def test_a_seed_replays_exactly() -> None:
    from cronlock._sim.run import plan_for_seed

    plan = plan_for_seed(104, "lease")
    first, second = run_plan(plan), run_plan(plan)
    assert first.trace == second.trace
    assert first.statements == second.statements
    assert [v.text() for v in first.judged.violations] == [
        v.text() for v in second.judged.violations
    ]
    assert first.judged.slots == second.judged.slots > 100
