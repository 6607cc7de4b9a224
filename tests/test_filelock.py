"""FileLocker across real processes: races, de-duplication, killed holders, cancellation."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

import cronlock._locking.files
from cronlock._errors import LockError
from cronlock._locking.files import FileLocker
from cronlock._locking.protocols import Hold, Locker

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FileLocker needs fcntl")

SLOT = datetime(2024, 3, 31, 1, 0, tzinfo=UTC)
LATER = SLOT + timedelta(hours=1)
# A safety net against a hung child, not a timing assertion.
PATIENCE = 60

# A replica process. "once": acquire, report ("lease" or the refusal), release. "hold":
# acquire, report, keep the lease until a line (or EOF) arrives on stdin. "race": like hold,
# but first report "ready" and wait for "go", so all racers call acquire at about one moment.
CHILD = """
import asyncio, sys
from datetime import datetime
from cronlock._locking.files import FileLocker

async def main() -> None:
    directory, job, slot, mode = sys.argv[1:]
    locker = FileLocker(directory)
    if mode == "race":
        print("ready", flush=True)
        sys.stdin.readline()
    lease = await locker.acquire(job, datetime.fromisoformat(slot))
    print(lease if isinstance(lease, str) else "lease", flush=True)
    if not isinstance(lease, str):
        if mode != "once":
            sys.stdin.readline()
        await lease.release()

asyncio.run(main())
"""


class Child:
    """One replica process driven over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, directory: Path, job: str, slot: datetime, mode: str) -> Child:
        src = str(Path(cronlock._locking.files.__file__).parents[1])
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(directory),
            job,
            slot.isoformat(),
            mode,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": src, "PYTHONUTF8": "1"},
        )
        return cls(proc)

    async def line(self) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(PATIENCE):
            return (await self.proc.stdout.readline()).decode().strip()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{text}\n".encode())

    async def finish(self) -> int:
        """Let the child release and exit; return its exit status."""
        if self.proc.returncode is None and self.proc.stdin is not None:
            self.proc.stdin.close()
        async with asyncio.timeout(PATIENCE):
            return await self.proc.wait()


@asynccontextmanager
async def holding(directory: Path, job: str, slot: datetime) -> AsyncIterator[Child]:
    """Run a child that has acquired *job* and holds it for the duration of the block."""
    child = await Child.start(directory, job, slot, "hold")
    try:
        assert await child.line() == "lease"
        yield child
    finally:
        await child.finish()


def granted(result: Hold | str) -> Hold:
    """Assert that acquire granted a lease, and return it."""
    assert not isinstance(result, str), f"refused: {result}"
    return result


async def in_child(directory: Path, job: str, slot: datetime) -> str:
    """Acquire and release in a fresh process; return "lease" or the refusal."""
    child = await Child.start(directory, job, slot, "once")
    result = await child.line()
    assert await child.finish() == 0
    return result


# (a) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("distinct_slots", [False, True], ids=["same-slot", "distinct-slots"])
async def test_racing_processes_get_exactly_one_hold(tmp_path: Path, distinct_slots: bool) -> None:
    # With distinct slots de-duplication cannot explain the refusals: only the flock can.
    slots = [SLOT + timedelta(minutes=i if distinct_slots else 0) for i in range(6)]
    children = [await Child.start(tmp_path, "race-job", slot, "race") for slot in slots]
    try:
        for child in children:
            assert await child.line() == "ready"
        for child in children:
            child.send("go")
        # Winners hold their lease until finish(), so every answer is given under contention.
        results = [await child.line() for child in children]
    finally:
        codes = [await child.finish() for child in children]
    # The winner holds on, so every loser finds the lock taken before it reads the ledger.
    assert sorted(results) == ["lease"] + ["locked"] * 5
    assert codes == [0] * 6


# (b) ----------------------------------------------------------------------------------


async def test_released_slot_is_never_granted_again_but_a_new_one_is(tmp_path: Path) -> None:
    assert await in_child(tmp_path, "job", SLOT) == "lease"
    assert await in_child(tmp_path, "job", SLOT) == "already_ran"
    assert await FileLocker(tmp_path).acquire("job", SLOT) == "already_ran"
    # The same instant in another zone is the same slot.
    berlin = SLOT.astimezone(timezone(timedelta(hours=2)))
    assert await FileLocker(tmp_path).acquire("job", berlin) == "already_ran"
    assert await in_child(tmp_path, "job", LATER) == "lease"


# (c) ----------------------------------------------------------------------------------


async def test_different_jobs_do_not_block_each_other(tmp_path: Path) -> None:
    async with holding(tmp_path, "backup", SLOT):
        assert await in_child(tmp_path, "reindex", SLOT) == "lease"
        assert await in_child(tmp_path, "backup", LATER) == "locked"
        await granted(await FileLocker(tmp_path).acquire("cleanup", SLOT)).release()


# (d) ----------------------------------------------------------------------------------


async def test_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    job = "../nightly/reindex ü"
    child = await Child.start(tmp_path, job, SLOT, "hold")
    try:
        assert await child.line() == "lease"
        locker = FileLocker(tmp_path)
        assert await locker.acquire(job, LATER) == "locked"  # held by the child
        child.proc.send_signal(signal.SIGKILL)
    finally:
        status = await child.finish()
    assert status == -signal.SIGKILL
    await granted(await locker.acquire(job, LATER)).release()
    # The dead holder's claim survives it: that slot is not run a second time.
    assert await locker.acquire(job, SLOT) == "already_ran"
    assert await in_child(tmp_path, job, LATER + timedelta(hours=1)) == "lease"


# (e) ----------------------------------------------------------------------------------


async def test_same_job_twice_in_one_process(tmp_path: Path) -> None:
    locker = FileLocker(tmp_path)
    lease = await locker.acquire("job", SLOT)
    assert isinstance(lease, Hold)
    assert await locker.acquire("job", LATER) == "locked"
    # Another locker on the same directory opens its own file description: still excluded.
    assert await FileLocker(tmp_path).acquire("job", LATER) == "locked"
    await lease.release()
    await lease.release()  # idempotent
    await granted(await locker.acquire("job", LATER)).release()


async def test_concurrent_acquires_in_one_process_grant_one(tmp_path: Path) -> None:
    locker = FileLocker(tmp_path)
    slots = [SLOT + timedelta(minutes=i) for i in range(10)]
    leases = await asyncio.gather(*(locker.acquire("job", slot) for slot in slots))
    assert (
        sorted(lease if isinstance(lease, str) else "lease" for lease in leases)
        == ["lease"] + ["locked"] * 9
    )
    for lease in leases:
        if not isinstance(lease, str):
            await lease.release()


# (f) ----------------------------------------------------------------------------------


async def test_torn_and_garbage_ledger_lines_are_tolerated(tmp_path: Path) -> None:
    locker = FileLocker(tmp_path)
    await granted(await locker.acquire("job", SLOT)).release()
    (ledger,) = tmp_path.glob("*.ledger")
    with ledger.open("ab") as file:  # garbage, bad UTF-8, a naive time, a torn last line
        file.write(b"garbage\n\xff\xfe\x00\n2024-03-31T05:00:00\n\n2024-03-31T0")
    # A killed writer may also leave a half-written temporary file behind.
    ledger.with_name(ledger.name + ".tmp").write_bytes(b"2024-03-31T0")
    assert await locker.acquire("job", SLOT) == "already_ran"
    await granted(await locker.acquire("job", LATER)).release()
    assert ledger.read_text().splitlines() == [SLOT.isoformat(), LATER.isoformat()]


async def test_ledger_keeps_the_last_remember_slots(tmp_path: Path) -> None:
    locker = FileLocker(tmp_path, remember=3)
    slots = [SLOT + timedelta(minutes=i) for i in range(5)]
    for slot in slots:
        await granted(await locker.acquire("job", slot)).release()
    (ledger,) = tmp_path.glob("*.ledger")
    assert ledger.read_text().splitlines() == [slot.isoformat() for slot in slots[-3:]]
    assert await locker.acquire("job", slots[-1]) == "already_ran"
    await granted(await locker.acquire("job", slots[0])).release()


# (g) ----------------------------------------------------------------------------------

UNSAFE_NAMES = [
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "a_b",
    "a?b",
    "A?B",
    ".",
    "..",
    "",
    ".hidden",
    "x" * 10_000,
    "日本語のジョブ",
    "emoji 🕒 job",
    "nul\x00byte",
    "lone \ud800 surrogate",
    "back\\slash",
]


async def test_unsafe_job_names_stay_inside_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "missing" / "locks"
    locker = FileLocker(directory)
    # All held at once: distinct names never share a lock file.
    leases = [granted(await locker.acquire(name, SLOT)) for name in UNSAFE_NAMES]
    for lease in leases:
        await lease.release()
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert all(path.parent == directory for path in files)
    assert len(files) == 2 * len(UNSAFE_NAMES)  # one lock file and one ledger per job
    assert all(len(path.name.encode()) <= 255 for path in files)
    assert not any(path.name.startswith(".") for path in files)


# (h) ----------------------------------------------------------------------------------


async def assert_free(directory: Path, job: str, slot: datetime) -> None:
    """Another process, and this one, can take *job* for *slot*."""
    assert await in_child(directory, job, slot) == "lease"
    await granted(await FileLocker(directory).acquire(job, slot + timedelta(days=1))).release()


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 8, 13, 50])
async def test_cancelled_acquire_leaves_no_lock_held(tmp_path: Path, steps: int) -> None:
    locker = FileLocker(tmp_path)
    task = asyncio.create_task(locker.acquire("job", SLOT))
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        # Cancelled before or during the claim: the claim was undone, the slot is free.
        await assert_free(tmp_path, "job", SLOT)
    else:  # the acquire finished before the cancel arrived
        await granted(lease).release()
        await assert_free(tmp_path, "job", LATER)
    await granted(await locker.acquire("job", SLOT + timedelta(days=2))).release()


async def test_acquire_cancelled_repeatedly_after_the_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stop the worker thread while it holds the flock and is about to write the claim.
    entered, proceed = threading.Event(), threading.Event()
    original: Callable[[FileLocker, str, list[str]], None] = FileLocker._write_ledger

    def paused(self: FileLocker, job: str, entries: list[str]) -> None:
        if not entered.is_set():
            entered.set()
            assert proceed.wait(PATIENCE)
        original(self, job, entries)

    monkeypatch.setattr(FileLocker, "_write_ledger", paused)
    locker = FileLocker(tmp_path)
    task = asyncio.create_task(locker.acquire("job", SLOT))
    assert await asyncio.to_thread(entered.wait, PATIENCE)
    for _ in range(5):  # a cancellation storm while the grant is in flight
        task.cancel()
        await asyncio.sleep(0)
    assert not task.done()  # still waiting for the thread, not abandoning it
    proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_free(tmp_path, "job", SLOT)


# errors and protocol -------------------------------------------------------------------


def test_implements_the_locker_protocol(tmp_path: Path) -> None:
    assert isinstance(FileLocker(tmp_path), Locker)


def test_directory_that_is_a_file_raises_lock_error(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(LockError, match="lock directory"):
        FileLocker(path)


async def test_os_error_becomes_lock_error_naming_job_and_path(tmp_path: Path) -> None:
    locker = FileLocker(tmp_path)
    await granted(await locker.acquire("job", SLOT)).release()
    (lock_file,) = tmp_path.glob("*.lock")
    lock_file.unlink()
    lock_file.mkdir()  # opening a directory for writing fails
    with pytest.raises(LockError, match=r"job 'job' at .*\.lock") as info:
        await locker.acquire("job", LATER)
    assert isinstance(info.value.__cause__, OSError)
    lock_file.rmdir()
    await granted(await locker.acquire("job", LATER)).release()  # nothing was left held


async def test_unreadable_ledger_raises_lock_error_and_holds_nothing(tmp_path: Path) -> None:
    locker = FileLocker(tmp_path)
    await granted(await locker.acquire("job", SLOT)).release()
    (ledger,) = tmp_path.glob("*.ledger")
    ledger.unlink()
    ledger.mkdir()
    with pytest.raises(LockError, match=r"ledger of job 'job' at .*\.ledger"):
        await locker.acquire("job", LATER)
    ledger.rmdir()
    await assert_free(tmp_path, "job", LATER)


async def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="remember"):
        FileLocker(tmp_path, remember=0)
    with pytest.raises(ValueError, match="aware"):
        await FileLocker(tmp_path).acquire("job", SLOT.replace(tzinfo=None))


def test_windows_is_rejected_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(LockError, match="Windows"):
        FileLocker(tmp_path)
