"""A session's statements take turns (``_conn/dedicated.Turns``): one at a time, in the
order they asked, except that a claim (urgent) goes before the others still waiting, so a
job's claim never queues behind a start's catch-up reads and note writes. No server
needed: the turns are what is tested."""

from __future__ import annotations

import asyncio

from cronlock.postgres._conn.dedicated import Turns


async def _statement(turns: Turns, name: str, order: list[str], *, urgent: bool = False) -> None:
    async with turns.turn(urgent=urgent):
        order.append(name)
        await asyncio.sleep(0)


async def test_an_urgent_statement_goes_before_the_others_waiting() -> None:
    turns, order = Turns(), list[str]()
    async with turns:  # a statement in flight
        waiting = [asyncio.create_task(_statement(turns, f"read {i}", order)) for i in range(3)]
        await asyncio.sleep(0)
        claim = asyncio.create_task(_statement(turns, "claim", order, urgent=True))
        await asyncio.sleep(0)
        assert order == []  # none while the session is busy
    await asyncio.gather(*waiting, claim)
    assert order == ["claim", "read 0", "read 1", "read 2"]
    assert not turns.locked()


async def test_a_cancelled_waiter_gives_its_turn_on() -> None:
    turns, order = Turns(), list[str]()
    async with turns:
        gone = asyncio.create_task(_statement(turns, "gone", order, urgent=True))
        after = asyncio.create_task(_statement(turns, "after", order))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
    await after
    assert gone.cancelled()
    assert order == ["after"]
    assert not turns.locked()


async def test_a_waiter_cancelled_once_handed_the_session_passes_it_on() -> None:
    turns, order = Turns(), list[str]()
    async with turns:
        handed = asyncio.create_task(_statement(turns, "handed", order))
        after = asyncio.create_task(_statement(turns, "after", order))
        await asyncio.sleep(0)
    handed.cancel()  # the session is handed to it; the cancel comes before it runs
    await asyncio.gather(handed, return_exceptions=True)
    await after
    assert order == ["after"]
    assert not turns.locked()
