"""Thousands of bad days a minute: random fault schedules (or named scenarios) run in the
deterministic fleet simulation and judged by the oracle of the promise.

    python benchmarks/simulate.py [--mode session|lease|both] [--schedules N] [--seed S]
                                  [--scenario NAME] [--fault TEXT ...] [--list]

Prints one line per failing schedule (its seed, its violations, the command that replays
it), then ``simulate: <N> schedules, <M> slots judged, <V> violations, <R> schedules/min``;
exits 1 on any violation. ``--allow-known`` counts the violations of the scenarios and
fault kinds listed as known defects (docs/testing.md) apart, without failing. A seed replays
exactly: the run is re-executed with ``PYTHONHASHSEED=0`` when that is not set already.
docs/testing.md says how to read, replay and extend it.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order is part of a replay
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from cronlock._sim.faults import parse_fault
from cronlock._sim.run import Mode, Plan, Result, plan_for_seed, run_plan
from cronlock._sim.scenarios import KNOWN, SCENARIOS, known_rules, scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("session", "lease", "both"), default="both")
    parser.add_argument("--schedules", type=int, default=100, help="random schedules per mode")
    parser.add_argument("--seed", type=int, help="first seed (default: drawn, and printed)")
    parser.add_argument("--scenario", help="run this named scenario ('all': every one)")
    parser.add_argument("--fault", action="append", default=[], help="a fault, as printed")
    parser.add_argument(
        "--pool", action="store_true", help="lease mode: each locker on an asyncpg pool (max 4)"
    )
    parser.add_argument("--list", action="store_true", help="name the scenarios and stop")
    parser.add_argument("--allow-known", action="store_true", help="known defects do not fail")
    parser.add_argument("--trace", action="store_true", help="print a failing run's trace")
    args = parser.parse_args()

    if args.list:
        for name, (modes, plan) in SCENARIOS.items():
            faults = " ".join(f.text() for f in plan.faults)
            print(f"{name:24} {'/'.join(modes):14} {faults}")
        return 0
    modes: list[Mode] = ["session", "lease"] if args.mode == "both" else [args.mode]
    plans: list[Plan] = []
    if args.scenario:
        names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
        for name in names:
            if name not in SCENARIOS:
                parser.error(f"no scenario {name!r} (--list names them)")
            plans += [scenario(name, mode) for mode in modes if mode in SCENARIOS[name][0]]
    elif args.fault:
        seed = args.seed if args.seed is not None else 1
        faults = tuple(parse_fault(text) for text in args.fault)
        plans = [Plan(mode, seed, faults, pool=args.pool and mode == "lease") for mode in modes]
    else:
        first = args.seed if args.seed is not None else random.randrange(1, 2**31)
        print(f"simulate: seeds {first}..{first + args.schedules - 1}", flush=True)
        plans = [
            plan_for_seed(first + i, mode, pool=args.pool and mode == "lease")
            for mode in modes
            for i in range(args.schedules)
        ]

    began = time.perf_counter()
    slots = violations = known = failed = 0
    for plan in plans:
        result = run_plan(plan)
        slots += result.judged.slots
        count = len(result.judged.violations)
        violations += count
        if result.ok:
            continue
        excused = args.allow_known and _known(result)
        known += count if excused else 0
        failed += 0 if excused else 1
        _report(result, excused=excused, trace=args.trace)
    minutes = (time.perf_counter() - began) / 60
    rate = len(plans) / minutes if minutes > 0 else float("inf")
    extra = f" ({known} of known defects)" if args.allow_known else ""
    print(
        f"simulate: {len(plans)} schedules, {slots} slots judged, {violations} violations{extra}, "
        f"{rate:.0f} schedules/min"
    )
    return 1 if failed else 0


def _known(result: Result) -> bool:
    """Whether every violation of *result* is one the known defects list."""
    plan = result.plan
    rules = {v.rule for v in result.judged.violations}
    if plan.name:
        return rules <= KNOWN.get((plan.name, plan.mode), frozenset())
    return rules <= known_rules(plan.mode, {fault.kind for fault in plan.faults})


def _report(result: Result, *, excused: bool, trace: bool) -> None:
    plan = result.plan
    tag = "known" if excused else "FAIL"
    label = plan.name or f"seed {plan.seed}"
    faults = " ".join(f.text() for f in plan.faults)
    print(f"{tag} {plan.mode} {label} [{faults}]: {len(result.judged.violations)} violation(s)")
    for violation in result.judged.violations[:8]:
        print(f"    {violation.text()}")
    if len(result.judged.violations) > 8:
        print(f"    ... {len(result.judged.violations) - 8} more")
    print(f"    replay: {plan.command()}")
    if trace:
        for line in result.trace:
            print(f"    | {line}")


if __name__ == "__main__":
    sys.exit(main())
