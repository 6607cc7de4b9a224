"""A job's arguments, checked against its task's signature when it is registered.

``args``/``kwargs`` are bound with the ``RunContext`` parameter left out, wherever it
stands: a missing, extra or doubled argument fails in ``add_job`` (or the decorator), not
at each run; and the context reaches its parameter while the args fill the others in order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from cronlock import JobFailed, RunContext, ScheduleError, Scheduler, every
from cronlock.testing import FakeClock

from .conftest import T0, Recorder

Seen = list[tuple[Any, ...]]


async def _run_once(scheduler: Scheduler, clock: FakeClock) -> None:
    async with scheduler:
        await clock.advance(10)


def _failures(recorder: Recorder) -> list[str]:
    return [repr(e.exception) for e in recorder.of(JobFailed)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_context_first_then_args(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder, kind: str
) -> None:
    seen: Seen = []

    async def report(ctx: RunContext, tenant_id: int) -> None:
        seen.append((ctx.job, ctx.slot, tenant_id))

    def plain_report(ctx: RunContext, tenant_id: int) -> None:
        seen.append((ctx.job, ctx.slot, tenant_id))

    task = report if kind == "async" else plain_report
    scheduler.add_job(task, every(10), name="report", args=(1,))
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert seen == [("report", T0 + timedelta(seconds=10), 1)]


async def test_context_last(scheduler: Scheduler, clock: FakeClock, recorder: Recorder) -> None:
    seen: Seen = []

    async def report(tenant_id: int, region: str, ctx: RunContext) -> None:
        seen.append((tenant_id, region, ctx.job))

    async def positional(tenant_id: int, ctx: RunContext, /) -> None:
        seen.append((tenant_id, ctx.job))

    scheduler.add_job(report, every(10), name="last", args=(1, "eu"))
    scheduler.add_job(positional, every(10), name="positional-only", args=(2,))
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert sorted(seen, key=len) == [(2, "positional-only"), (1, "eu", "last")]


async def test_context_in_the_middle(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: Seen = []

    async def report(tenant_id: int, ctx: RunContext, region: str, *, dry: bool) -> None:
        seen.append((tenant_id, ctx.job, region, dry))

    scheduler.add_job(report, every(10), name="middle", args=(1, "eu"), kwargs={"dry": True})
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert seen == [(1, "middle", "eu", True)]


async def report(ctx: RunContext, tenant_id: int) -> None:
    pass


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        ((), None, ["job 'r'", "missing argument 'tenant_id'"]),
        ((1, 2), None, ["job 'r'", "unexpected argument 2"]),
        ((1,), {"x": 3}, ["job 'r'", "unexpected argument 'x'"]),
        ((1,), {"tenant_id": 1}, ["job 'r'", "'tenant_id' given twice"]),
        ((1,), {"ctx": None}, ["job 'r'", "'ctx' given twice", "RunContext"]),
        ((), {"ctx": None, "tenant_id": 1}, ["job 'r'", "'ctx' given twice"]),
    ],
)
def test_bad_arguments_fail_at_registration(
    scheduler: Scheduler, args: tuple[Any, ...], kwargs: dict[str, Any] | None, words: list[str]
) -> None:
    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(report, every(10), name="r", args=args, kwargs=kwargs)
    for word in words:
        assert word in str(info.value)
    assert scheduler.jobs == ()


def test_an_unannotated_ctx_is_an_ordinary_parameter_with_a_hint(scheduler: Scheduler) -> None:
    async def untyped(ctx) -> None:  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(ScheduleError) as info:
        scheduler.add_job(untyped, every(10), name="untyped")
    message = str(info.value)
    assert "job 'untyped'" in message
    assert "missing argument 'ctx'" in message
    assert "annotate it `ctx: RunContext` to receive the run's context" in message
    # Given a value, it is just a parameter.
    scheduler.add_job(untyped, every(10), name="given", args=(1,))


async def test_decorators_check_and_pass_args(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: Seen = []

    @scheduler.every(10, name="every", args=(1,))
    async def by_interval(ctx: RunContext, tenant_id: int) -> None:
        seen.append((ctx.job, tenant_id))

    @scheduler.cron("* * * * *", name="cron", args=(2,))
    async def by_cron(ctx: RunContext, tenant_id: int) -> None:
        seen.append((ctx.job, tenant_id))

    with pytest.raises(ScheduleError, match="job 'missing': missing argument 'tenant_id'"):

        @scheduler.cron("* * * * *", name="missing")
        async def missing(ctx: RunContext, tenant_id: int) -> None:
            pass

    with pytest.raises(ScheduleError, match="job 'extra': unexpected argument 3"):

        @scheduler.every(10, name="extra", args=(1, 3))
        async def extra(ctx: RunContext, tenant_id: int) -> None:
            pass

    async with scheduler:
        await clock.advance(61)
    assert _failures(recorder) == []
    assert ("every", 1) in seen
    assert ("cron", 2) in seen


class Reports:
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def run(self, ctx: RunContext, tenant_id: int) -> None:
        self.seen.append(("method", ctx.job, tenant_id))

    async def __call__(self, ctx: RunContext, tenant_id: int) -> None:
        self.seen.append(("object", ctx.job, tenant_id))


async def test_variadic_partial_method_and_callable_object_tasks(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: Seen = []

    async def fan_out(ctx: RunContext, *tenants: int, **options: str) -> None:
        seen.append(("fan", ctx.job, tenants, options))

    async def regional(ctx: RunContext, tenant_id: int, region: str) -> None:
        seen.append(("partial", ctx.job, tenant_id, region))

    scheduler.add_job(fan_out, every(10), name="a", args=(1, 2, 3), kwargs={"mode": "full"})
    scheduler.add_job(functools.partial(regional, region="eu"), every(10), name="b", args=(4,))
    scheduler.add_job(Reports(seen).run, every(10), name="c", args=(5,))
    scheduler.add_job(Reports(seen), every(10), name="d", args=(6,))
    with pytest.raises(ScheduleError, match="job 'e': missing argument 'tenant_id'"):
        scheduler.add_job(functools.partial(regional, region="eu"), every(10), name="e")
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert sorted(seen, key=repr) == sorted(
        [
            ("fan", "a", (1, 2, 3), {"mode": "full"}),
            ("partial", "b", 4, "eu"),
            ("method", "c", 5),
            ("object", "d", 6),
        ],
        key=repr,
    )


async def test_builtins_are_checked_when_their_signature_can_be_read(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: list[int] = []
    scheduler.add_job(seen.append, every(10), name="append", args=(1,))
    with pytest.raises(ScheduleError, match="job 'bare': missing argument 'object'"):
        scheduler.add_job(seen.append, every(10), name="bare")
    # dict's signature cannot be read: registered unchecked, called as given.
    scheduler.add_job(dict, every(10), name="dict", kwargs={"a": 1})
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert seen == [1]


async def test_a_string_annotation_that_cannot_be_resolved_still_finds_the_context(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: Seen = []

    async def report(ctx: RunContext, tenant_id: int) -> None:
        seen.append((ctx.job, tenant_id))

    report.__annotations__["tenant_id"] = "NoSuchName"  # get_type_hints would raise
    scheduler.add_job(report, every(10), name="unresolved", args=(1,))
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert seen == [("unresolved", 1)]


def test_jobs_given_one_task_alike_share_its_call_shape(scheduler: Scheduler) -> None:
    task: Callable[..., object] = report
    jobs = [scheduler.add_job(task, every(10), name=f"j{i}", args=(i,)) for i in range(3)]
    shapes = {id(job._task) for job in jobs}
    assert len(shapes) == 1
    assert jobs[0]._task == (True, "ctx", 0)


def test_the_check_is_made_for_each_new_shape_of_arguments(scheduler: Scheduler) -> None:
    # The same task given a new count of args, or other keyword names, in a row is checked
    # anew (new_job's shortcut and task_shape must agree), not waved through.
    scheduler.add_job(report, every(10), name="ok", args=(1,))
    with pytest.raises(ScheduleError, match="missing argument 'tenant_id'"):
        scheduler.add_job(report, every(10), name="bad")
    scheduler.add_job(report, every(10), name="ok again", args=(2,))
    scheduler.add_job(report, every(10), name="by keyword", kwargs={"tenant_id": 3})
    with pytest.raises(ScheduleError, match="missing argument 'tenant_id'"):
        scheduler.add_job(report, every(10), name="bad again")
    with pytest.raises(ScheduleError, match="unexpected argument 'tenant'"):
        scheduler.add_job(report, every(10), name="misnamed", kwargs={"tenant": 3})
    assert [job.name for job in scheduler.jobs] == ["ok", "ok again", "by keyword"]


async def test_a_positional_only_context_after_defaults_needs_the_args_before_it(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: Seen = []

    async def task(region: str = "eu", ctx: RunContext = None, /) -> None:  # type: ignore[assignment]
        seen.append((region, ctx.job))

    with pytest.raises(ScheduleError, match="job 'short': the RunContext parameter 'ctx'"):
        scheduler.add_job(task, every(10), name="short")
    scheduler.add_job(task, every(10), name="full", args=("us",))
    await _run_once(scheduler, clock)
    assert _failures(recorder) == []
    assert seen == [("us", "full")]
