"""docs/cronlock-alerts.yml: well-formed, about metrics cronlock exports, and (with promtool)
valid and firing when it should (tests/observability/alerts_test.yml)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from cronlock import Scheduler, every
from cronlock.prometheus import instrument

HERE = Path(__file__).parent
RULES = HERE.parent.parent / "docs" / "cronlock-alerts.yml"


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert isinstance(document, dict)
    assert list(document) == ["groups"]
    [group] = document["groups"]
    assert group["name"] == "cronlock"
    found: list[dict[str, Any]] = group["rules"]
    return found


def test_the_rules_are_well_formed() -> None:
    found = rules()
    assert [r["alert"] for r in found] == [
        "CronlockJobOverdue",
        "CronlockNoSuccess",
        "CronlockJobFailing",
        "CronlockLockErrors",
        "CronlockJobAbsent",
        "CronlockJobConflict",
        "CronlockScheduleRejected",
    ]
    for rule in found:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["expr"], str)
        assert rule["expr"].strip()
        assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["labels"]["severity"] in ("page", "warn")
        assert rule["annotations"]["summary"]


async def test_the_rules_use_only_metrics_cronlock_exports() -> None:
    registry = CollectorRegistry()
    scheduler = Scheduler()
    scheduler.add_job(lambda: None, every(60), name="j")
    instrument(scheduler, registry)
    async with scheduler:
        exported = generate_latest(registry).decode()
    names = {line.split()[2] for line in exported.splitlines() if line.startswith("# TYPE")}
    names |= {f"{name}_total" for name in names}
    used = {m for r in rules() for m in re.findall(r"cronlock_[a-z_]+", r["expr"])}
    assert "cronlock_job" in used  # the label the rules group by, never Prometheus's job
    used.discard("cronlock_job")
    assert "cronlock_schedule_rejected" in names  # exported (no series without a ledger)
    assert used
    assert used <= names, used - names


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    for args in (["check", "rules", str(RULES)], ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run(
            [promtool, *args], cwd=HERE, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout + result.stderr
