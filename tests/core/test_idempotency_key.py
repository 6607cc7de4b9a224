"""The slot's idempotency key (RunContext.idempotency_key): its documented format, the same for
every attempt and replica of a slot, different per job, slot and namespace, and where its
namespace comes from. On the fake clock; the queues' end-to-end tests are in tests/queues."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from cronlock import (
    ConfigError,
    InMemoryLocker,
    RunContext,
    Scheduler,
    every,
    idempotency_key,
)
from cronlock.postgres import PostgresLocker
from cronlock.testing import FakeClock

from .conftest import T0

# The recipe as docs/guides/queues.md gives it, written out independently of cronlock's code.
_ROOT = uuid.UUID("2e26542d-3e24-5b24-a0c4-75c0c9961761")


def _documented(namespace: str, job: str, when: str) -> str:
    return str(uuid.uuid5(_ROOT, f"{namespace}\n{job}\n{when}"))


def test_the_key_is_the_documented_uuid5() -> None:
    slot = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
    key = idempotency_key("billing", "nightly-report", slot)
    assert key == _documented("billing", "nightly-report", "2026-12-05T03:00:00Z")
    assert len(key) == 36 and uuid.UUID(key).version == 5
    # The root is itself derived as documented.
    assert uuid.uuid5(uuid.NAMESPACE_URL, "cronlock:idempotency-key") == _ROOT


def test_the_slot_is_read_in_utc_with_a_fraction_only_when_there_is_one() -> None:
    berlin_4am = datetime(2026, 12, 5, 4, 0, tzinfo=timezone(timedelta(hours=1)))
    assert idempotency_key("", "j", berlin_4am) == _documented("", "j", "2026-12-05T03:00:00Z")
    fraction = datetime(2026, 12, 5, 3, 0, 0, 250000, tzinfo=UTC)
    assert idempotency_key("", "j", fraction) == _documented("", "j", "2026-12-05T03:00:00.250000Z")
    with pytest.raises(ValueError, match="naive"):
        idempotency_key("", "j", datetime(2026, 12, 5, 3, 0))


def test_keys_differ_per_job_slot_and_namespace() -> None:
    slot = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
    keys = {
        idempotency_key("", "a", slot),
        idempotency_key("", "b", slot),
        idempotency_key("", "a", slot + timedelta(seconds=1)),
        idempotency_key("svc", "a", slot),
        # Where the separators would fall if a namespace held one: still a different text.
        idempotency_key("svc\na", "", slot),
    }
    assert len(keys) == 5


def test_the_context_gives_the_key_of_its_namespace_job_and_slot() -> None:
    slot = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
    context = RunContext("j", slot, slot, 1, attempt=2, namespace="svc")
    assert context.idempotency_key == idempotency_key("svc", "j", slot)


async def test_every_attempt_at_a_slot_has_the_same_key_and_the_next_slot_another(
    clock: FakeClock,
) -> None:
    scheduler = Scheduler(clock=clock, locker=InMemoryLocker(), idempotency_namespace="svc")
    seen: list[tuple[int, datetime, str, str]] = []

    async def send(ctx: RunContext) -> None:
        seen.append((ctx.attempt, ctx.slot, ctx.namespace, ctx.idempotency_key))
        if ctx.attempt == 1:
            raise ConnectionError("broker down")

    scheduler.add_job(send, every(3600), name="hand-off", retries=2, retry_delay=1)
    async with scheduler:
        await clock.advance(2 * 3600 + 60)
    first, second = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    assert [(a, s, n) for a, s, n, _ in seen] == [
        (1, first, "svc"),
        (2, first, "svc"),
        (1, second, "svc"),
        (2, second, "svc"),
    ]
    keys = [key for *_, key in seen]
    assert keys[0] == keys[1] == idempotency_key("svc", "hand-off", first)
    assert keys[2] == keys[3] == idempotency_key("svc", "hand-off", second)
    assert keys[0] != keys[2]


async def test_replicas_of_one_service_agree_on_the_key(clock: FakeClock) -> None:
    """Two schedulers sharing a locker (two replicas): whichever runs the slot, its key is
    the same, and a job run on both (distributed=False) hands the slot off with one key."""
    locker = InMemoryLocker()
    keys: dict[str, list[str]] = {"a": [], "b": []}

    def replica(name: str) -> Scheduler:
        scheduler = Scheduler(clock=clock, locker=locker)

        async def send(ctx: RunContext) -> None:
            keys[name].append(ctx.idempotency_key)

        scheduler.add_job(send, every(60), name="everywhere", distributed=False)
        return scheduler

    async with replica("a"), replica("b"):
        await clock.advance(60)
    assert keys["a"] == keys["b"] == [idempotency_key("", "everywhere", T0 + timedelta(60 / 86400))]


def test_the_namespace_defaults_to_the_ledgers_name() -> None:
    dsn = "postgresql://nobody@127.0.0.1:1/none"  # never connected: the name is all it reads
    assert PostgresLocker(dsn).idempotency_namespace() == "cronlock_runs"
    assert PostgresLocker(dsn, table="runs", schema="billing").idempotency_namespace() == (
        "billing.runs"
    )
    assert PostgresLocker(dsn, ledger=False).idempotency_namespace() == ""


async def test_the_scheduler_passes_the_ledgers_name_unless_given_one(clock: FakeClock) -> None:
    """The run's context, as the job's call makes it (a scheduler on an unreachable server
    is never started here)."""
    dsn = "postgresql://nobody@127.0.0.1:1/none"
    seen: list[str] = []

    async def send(ctx: RunContext) -> None:
        seen.append(ctx.namespace)

    ledger = PostgresLocker(dsn, table="runs", schema="billing")
    jobs = [
        Scheduler(clock=clock, locker=ledger).add_job(send, every(60), name="j"),
        Scheduler(clock=clock, locker=ledger).add_job(send, every(60), name="j", distributed=False),
        Scheduler(clock=clock, locker=ledger, idempotency_namespace="svc").add_job(
            send, every(60), name="j"
        ),
        Scheduler(clock=clock).add_job(send, every(60), name="j", locker=ledger),
        Scheduler(clock=clock).add_job(send, every(60), name="j"),
    ]
    for job in jobs:
        await job.call(T0, T0, 1)
    assert seen == ["billing.runs", "billing.runs", "svc", "billing.runs", ""]


@pytest.mark.parametrize("bad", [3, "a\nb", "tab\there"])
def test_a_namespace_that_is_not_printable_text_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="idempotency_namespace"):
        Scheduler(idempotency_namespace=bad)  # type: ignore[arg-type]
