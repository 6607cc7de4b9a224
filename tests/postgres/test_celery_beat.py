"""Beat replicas through incidents: each slot's task sent once, as real workers receive it.

Three real beat replicas (two ``celery beat -S cronlock.celery.BeatScheduler``, one
``python -m cronlock celery-beat``) and two real Celery workers on the machine's Redis
(a queue and key prefix of the test's own), 20 entries every second, coordinating through
a throwaway PostgreSQL cluster. Mid-run one beat replica is ``kill -9``'ed and started
again, and the database crashes and restarts (``pg_ctl restart -m immediate``). The
workers write down every task they execute. A task id is derived from (ledger, entry,
slot) and each send carries a random send id, so the test tells a slot sent twice (one
task id, two send ids) from a send delivered twice (one send id, two executions) and from
a slot never sent.

What the incidents may cost, by cronlock's rules: slots that fell due while no replica
could reach the database are owed and coalesce into one late send per entry when it is
back (docs/guides/failover.md); in lease mode, the entries whose sends the killed replica
had in flight are held until its leases expire (5 s), and their slots meanwhile are not
sent (docs/guides/celery-beat.md); a slot the killed replica sent but had not recorded is
sent again under the same id once its claim lapses (``cronlock_recover``). Every other
slot is sent, and none twice.

One shorter run goes through a RabbitMQ server of the test's own (Debian's
rabbitmq-server on free ports, always stopped).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import asyncpg
import pytest

from cronlock.celery._settings import DEFAULT_LEASE
from cronlock.postgres._conn.backoff import RECONNECT_MAX

from ..eventually import eventually_blocking
from .celery_fleet import (
    CeleryFleet,
    PrivateRabbit,
    RabbitUnavailable,
    Verdict,
    free_port,
    judge,
)
from .cluster import Cluster

# One worker runs them all, one after another: each is a fleet of processes of its own.
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.xdist_group("celery-fleet")]

REDIS = os.environ.get("CRONLOCK_TEST_REDIS", "redis://127.0.0.1:6379/0")
DURATION = 45  # seconds of slots the main test judges (the restart at 32 s)
ENTRIES = 20


def _service_missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture
def redis_broker() -> str:
    """The machine's Redis (``CRONLOCK_TEST_REDIS``), answering; a test keeps to its prefix."""
    import redis

    client = redis.Redis.from_url(REDIS, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        _service_missing(f"NO REDIS at {REDIS}: the Celery beat tests did not run ({exc})")
    finally:
        client.close()
    return REDIS


def _drop_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def rabbit() -> Iterator[PrivateRabbit]:
    try:
        server = PrivateRabbit()
    except RabbitUnavailable as exc:
        _service_missing(f"NO RABBITMQ SERVER: {exc}")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def succeeded(metrics: str, job: str) -> float:
    """``cronlock_runs_total{cronlock_job=JOB, outcome="succeeded"}`` in *metrics*."""
    found = re.search(
        rf'^cronlock_runs_total\{{cronlock_job="{job}",outcome="succeeded"\}} (\S+)$',
        metrics,
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0


def sleep_until(epoch: float) -> None:
    time.sleep(max(0.0, epoch - time.time()))


def drain(fleet: CeleryFleet, first: float, last: float, timeout: float = 60) -> Verdict:
    """The verdict once the workers have received all they will of the window's slots (3 s
    without news of them: the beats go on sending later slots meanwhile)."""
    give_up = time.monotonic() + timeout
    seen, quiet_since = -1, time.monotonic()
    while True:
        verdict = judge(fleet, first, last)
        if verdict.deliveries != seen:
            seen, quiet_since = verdict.deliveries, time.monotonic()
        elif time.monotonic() - quiet_since > 3 or time.monotonic() > give_up:
            return verdict
        time.sleep(0.5)


async def ledger_rows(dsn: str, table: str, first: float, last: float) -> dict[str, int]:
    """Outcomes the ledger recorded for the window's slots (attempts counted once each)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            f"SELECT outcome, count(*) AS n FROM {table} "  # (the test's own table)
            "WHERE slot >= to_timestamp($1) AND slot <= to_timestamp($2) GROUP BY outcome",
            first,
            last,
        )
    finally:
        await conn.close()
    return {row["outcome"] or "unfinished": row["n"] for row in rows}


async def slot_records(dsn: str, table: str, first: float, last: float) -> dict[str, int]:
    """The ledger's records of the window's slots that did not run (``<table>_slots``:
    skipped, coalesced, missed), counted by fate and reason: what the replicas said of the
    slots they did not send."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            f"SELECT fate, reason, count(*) AS n FROM {table}_slots "  # (the test's own)
            "WHERE last_slot >= to_timestamp($1) AND slot <= to_timestamp($2) "
            "GROUP BY fate, reason",
            first,
            last,
        )
    finally:
        await conn.close()
    return {f"{row['fate']}: {row['reason']}": row["n"] for row in rows}


def report(name: str, figures: dict[str, object]) -> None:
    """Print the run's figures (``pytest -s`` shows them; CRONLOCK_CELERY_REPORT keeps them)."""
    line = json.dumps({"test": name, **figures}, default=str)
    print(line)
    out = os.environ.get("CRONLOCK_CELERY_REPORT")
    if out:
        with open(out, "a") as sink:
            sink.write(line + "\n")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", ["session", "lease"])
def test_three_beats_two_workers_through_a_beat_kill_and_a_database_restart(
    mode: str, restartable_pg: Cluster, redis_broker: str, tmp_path: Path
) -> None:
    cluster = restartable_pg
    fleet = CeleryFleet(tmp_path, broker=redis_broker, dsn=cluster.dsn, mode=mode, entries=ENTRIES)
    began = time.monotonic()
    try:
        fleet.worker("w1")
        fleet.worker("w2")
        fleet.beat("b1")
        fleet.beat("b2")
        fleet.beat("b3", form="cli")
        fleet.wait_ready("b1", "b2", "b3")
        first = float(math.ceil(time.time()) + 2)
        last = first + DURATION - 1

        sleep_until(first + 12)
        killed = time.time()
        fleet.kill("b1")  # kill -9, mid-run
        sleep_until(first + 17)
        fleet.beat("b1")
        fleet.wait_ready("b1")

        sleep_until(first + 32)
        down = time.time()
        cluster.restart("immediate")  # a crash: sessions cut, no checkpoint, then recovery
        up = time.time()

        sleep_until(last + 4)  # the last slots, and any late one, sent
        # A send the killed beat made and never recorded is re-sent once its claim is
        # marked crashed (tens of seconds after the kill): wait for the ledger to have no
        # claim left open in the window, then for the workers.
        eventually_blocking(
            lambda: (
                "unfinished" not in asyncio.run(ledger_rows(cluster.dsn, fleet.ledger, first, last))
            ),
            "the killed beat's open claims to be marked crashed and sent again",
            120,
            every=1.0,
        )
        verdict = drain(fleet, first, last)
        exits = {name: fleet.terminate(name) for name in ("b1", "b2", "b3")}
        for name in ("w1", "w2"):
            fleet.terminate(name)
        outcomes = asyncio.run(ledger_rows(cluster.dsn, fleet.ledger, first, last))
        records = asyncio.run(slot_records(cluster.dsn, fleet.ledger, first, last))
    finally:
        fleet.stop()
        _drop_keys(redis_broker, fleet.queue)

    # What an outage may cost: slots due from the restart until the replicas reconnected
    # (their backoff, at most RECONNECT_MAX between tries) coalesce into one late send.
    outage = (down - 1, up + RECONNECT_MAX + 2)
    in_outage = [(e, s) for e, s in verdict.missing if outage[0] <= s <= outage[1]]
    # Lease mode: a replica killed mid-send holds its entries until its lease (5 s for the
    # beat) expires; their slots meanwhile are refused on every replica (docs/guides/
    # celery-beat.md). Session mode has no such window: the server frees a dead session's
    # locks at once.
    held = (killed - 1, killed + DEFAULT_LEASE + 2) if mode == "lease" else (0.0, -1.0)
    in_lease = [(e, s) for e, s in verdict.missing if held[0] <= s <= held[1]]
    outside = [m for m in verdict.missing if m not in in_outage and m not in in_lease]
    # A slot the killed replica had sent but not yet recorded when it died is sent again,
    # under the same id, once its claim lapses (cronlock_recover, the default: the guide's
    # guarantee, which the id lets a worker recognise). Nothing else may be sent twice.
    slot_of = {
        r["id"]: datetime.fromisoformat(r["slot"]).timestamp()
        for r in fleet.received()
        if r.get("slot")
    }
    resent = [tid for tid in verdict.sent_twice if killed - 3 <= slot_of[tid] <= killed + 1]
    twice = [tid for tid in verdict.sent_twice if tid not in resent]
    report(
        f"celery-beat-redis-{mode}",
        {
            "slots": verdict.slots,
            "sent": verdict.sent,
            "delivered": verdict.deliveries,
            "sent_twice": len(twice),
            "resent_after_kill": len(resent),
            "delivered_twice": len(verdict.delivered_twice),
            "missed_outside_outage": len(outside),
            "coalesced_in_outage": len(in_outage),
            "held_by_killed_lease": len(in_lease),
            "outage_s": round(up - down, 2),
            "ledger": outcomes,
            "slot_records": records,
            "run_s": round(time.monotonic() - began, 1),
        },
    )
    assert verdict.wrong_id == []
    assert twice == [], "a slot was sent twice (two attempts, one id), not after the kill"
    assert verdict.delivered_twice == [], "a send was executed twice"
    assert outside == [], (
        f"slots never sent, outside the incidents' windows: {outside[:10]}; "
        f"the ledger's records of slots not run: {records}"
    )
    # Each entry's slots around the outage end in a send: the owed slot, late, once.
    for entry in fleet.entries:
        after = [s for e, s in verdict.missing if e == entry]
        if after:
            assert max(after) < last, f"{entry}: the slots owed at the end were never sent"
    # The ledger shows every send as a run that succeeded; nothing is left unfinished.
    assert outcomes.get("succeeded", 0) == verdict.sent
    assert outcomes.get("unfinished", 0) == 0
    # The replicas stop cleanly on SIGTERM (b1 is the one started again).
    assert exits == {"b1": 0, "b2": 0, "b3": 0}, {n: fleet.log(n)[-2000:] for n in exits}


def test_a_slot_due_while_its_entry_still_sends_waits_for_that_send() -> None:
    """A beat entry's slot that falls due while its previous send goes on (a slow broker, a
    replica's first sends, which connect) is sent after it, not skipped: the sending
    replica holds the entry's lock meanwhile, so no other replica may send that slot."""
    from celery import Celery

    from cronlock.celery import beat_scheduler

    app = Celery("overlap", broker="memory://")
    app.conf.update(
        cronlock_dsn="postgresql://nobody@127.0.0.1:1/none",  # never connected to
        beat_schedule={"e": {"task": "t.x", "schedule": 1.0}},
        enable_utc=True,
        timezone="UTC",
    )
    assert [(job.name, job.overlap) for job in beat_scheduler(app).jobs] == [("e", "queue")]


@pytest.mark.timeout(300)
def test_two_beats_over_rabbitmq_each_slot_delivered_once(
    rabbit: PrivateRabbit, pg_dsn: str, tmp_path: Path
) -> None:
    fleet = CeleryFleet(tmp_path, broker=rabbit.url, dsn=pg_dsn, entries=4)
    ports = free_port(), free_port()
    try:
        fleet.worker("w1")
        fleet.beat("b1", metrics_port=ports[0])
        fleet.beat("b2", form="cli", metrics_port=ports[1])
        fleet.wait_ready("b1", "b2")
        first = float(math.ceil(time.time()) + 2)
        last = first + 14
        sleep_until(last + 3)
        verdict = drain(fleet, first, last)
        # Each replica's metrics count the sends it made, as runs of the entry's job.
        scraped = [scrape(port) for port in ports]
        exits = {name: fleet.terminate(name) for name in ("b1", "b2")}
        fleet.terminate("w1")
    finally:
        fleet.stop()
    report(
        "celery-beat-rabbitmq",
        {
            "slots": verdict.slots,
            "sent": verdict.sent,
            "delivered": verdict.deliveries,
            "sent_twice": len(verdict.sent_twice),
            "delivered_twice": len(verdict.delivered_twice),
            "missed": len(verdict.missing),
        },
    )
    assert verdict.slots == 4 * 15
    assert verdict.wrong_id == []
    assert verdict.sent_twice == verdict.delivered_twice == []
    assert verdict.missing == []
    assert verdict.deliveries == verdict.slots
    assert exits == {"b1": 0, "b2": 0}
    for entry in fleet.entries:
        sends = sum(succeeded(text, entry) for text in scraped)
        assert sends >= 15  # the window's slots, and any sent before it
    # The test's broker was a server of its own, on its own port, and is gone once stopped.
    assert rabbit.port != 5672
    rabbit.stop()

    def closed() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", rabbit.port)) != 0

    eventually_blocking(closed, "the private RabbitMQ to stop", 30, every=0.2)
