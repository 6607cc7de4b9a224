"""cronlock works without its observability extras, and never imports them by itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_BLOCKED = textwrap.dedent(
    """
    import asyncio, sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import cronlock, cronlock.postgres, cronlock.testing
    from datetime import UTC, datetime

    async def main():
        clock = cronlock.testing.FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
        scheduler = cronlock.Scheduler(clock=clock)
        runs = []
        scheduler.add_job(lambda: runs.append(1), cronlock.every(10), name="j")
        async with scheduler:
            await clock.advance(30)
        assert scheduler.overdue() == ()
        return len(runs)

    assert asyncio.run(main()) == 3
    for module, extra in (("cronlock.prometheus", "prometheus"), ("cronlock.otel", "otel")):
        try:
            __import__(module)
        except ImportError as exc:
            assert f"pip install 'cronlock[{extra}]'" in str(exc), exc
        else:
            raise SystemExit(f"{module} imported without its extra")
    print("ok")
    """
)


def test_cronlock_runs_without_the_extras() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_import_cronlock_does_not_import_the_extras_when_installed() -> None:
    code = (
        "import sys, cronlock, cronlock.postgres; "
        "print(sorted(m for m in sys.modules "
        "if m.startswith(('prometheus_client', 'opentelemetry'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
