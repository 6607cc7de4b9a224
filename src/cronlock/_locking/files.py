"""FileLocker: coordinate the processes of one host through flock(2) and a slot ledger."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

from .._cancel import claim_or_undo, task_name
from .._errors import ConfigError, LockError
from .._logs import at, get_logger
from .protocols import Hold, Refusal, remember_claim

if sys.platform != "win32":
    import fcntl

__all__ = ("FileLocker",)

_logger = get_logger("cronlock.lock")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def _stem(job: str) -> str:
    # The hash keeps distinct names distinct (also on case-insensitive file systems); the
    # prefix is only there for humans. The prefix has no dots or separators, so no name can
    # climb out of the directory or hide as a dotfile, and it is short enough that the whole
    # file name stays far below the usual 255-byte limit.
    digest = hashlib.sha256(job.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    prefix = _UNSAFE.sub("_", job)[:48].strip("_") or "job"
    return f"{prefix}-{digest}"


def _slot_key(job: str, slot: datetime) -> str:
    if slot.tzinfo is None or slot.utcoffset() is None:
        raise ValueError(f"slot for job {job!r} must be an aware datetime, got {slot!r}")
    return slot.astimezone(UTC).isoformat()


def _parse_ledger(text: str) -> list[str]:
    # Skip what does not parse: a torn last line from a writer killed mid-write (by some
    # other tool; our own writes are atomic) or garbage must not block future claims.
    entries: dict[str, None] = {}
    for line in text.splitlines():
        try:
            when = datetime.fromisoformat(line.strip())
        except ValueError:
            continue
        if when.tzinfo is not None:
            entries[when.astimezone(UTC).isoformat()] = None
    return list(entries)


class _FileHold:
    """The held flock of one job, plus what is needed to undo the claim."""

    __slots__ = ("_fd", "_job", "_locker", "_previous")

    def __init__(self, locker: FileLocker, job: str, fd: int, previous: list[str]) -> None:
        self._locker = locker
        self._job = job
        self._fd: int | None = fd
        self._previous = previous

    async def release(self) -> None:
        """Unlock and close the lock file; the claimed slot stays claimed. Idempotent."""
        # No await in here: the unlock cannot be interrupted half-way by a cancellation.
        self._release()

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            try:
                # Unlock explicitly before closing: a forked child may share this open file
                # description, and then closing our descriptor alone would not free the lock.
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        except OSError as exc:
            path = self._locker._lock_path(self._job)
            raise LockError(f"cannot unlock job {self._job!r} at {str(path)!r}: {exc}") from exc
        finally:
            self._locker._forget(self._job)

    def _abandon(self) -> None:
        # The acquiring task was cancelled after the claim was written. Nobody will run the
        # slot, so restore the ledger while still holding the flock (no other process can
        # have touched it), then unlock: another process may claim the slot instead.
        # Log failures instead of raising: the caller is about to re-raise CancelledError.
        try:
            self._locker._write_ledger(self._job, self._previous)
        except LockError:
            _logger.warning(
                "job %r: could not undo a cancelled claim",
                self._job,
                exc_info=True,
                extra=at(self._job),
            )
        try:
            self._release()
        except LockError:
            _logger.warning(
                "job %r: could not unlock after a cancel",
                self._job,
                exc_info=True,
                extra=at(self._job),
            )


class FileLocker:
    """Coordinates several processes on one host: mutual exclusion per job, each slot once.

    Each job has a lock file in *directory*, locked with a non-blocking ``flock(2)``, and a
    ledger file of the slots already claimed (ISO 8601 UTC, one per line, the last
    *remember* kept), read and rewritten under that lock. The kernel drops the lock of a
    process that dies, so a crashed holder never blocks the others; its claimed slot stays
    claimed. *directory* is created if missing; file names are derived from a hash of the
    job name, so any name is safe. Use it on a local file system: flock over NFS is
    emulated, and not every network file system supports it. POSIX only: on Windows the
    constructor raises :class:`cronlock.LockError`.
    """

    def __init__(self, directory: str | os.PathLike[str], *, remember: int = 1024) -> None:
        if sys.platform == "win32":
            raise LockError(
                "FileLocker needs fcntl.flock, which Windows lacks; "
                "use InMemoryLocker or cronlock.postgres.PostgresLocker"
            )
        if remember < 1:
            raise ConfigError(f"FileLocker: remember must be at least 1, got {remember!r}")
        self._directory = Path(directory)
        self._remember = remember
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LockError(f"cannot create lock directory {str(directory)!r}: {exc}") from exc
        # flock excludes a second open file description even in this process, but where it
        # is emulated with per-process POSIX locks (NFS) it would not, so track our own
        # holders too. A threading lock: the file work runs in worker threads.
        self._held: set[str] = set()
        self._mutex = threading.Lock()

    async def acquire(self, job: str, slot: datetime) -> Hold | Refusal:
        """Claim *slot* of *job*: a hold, ``"locked"`` if the job is held (in this process or
        another), or ``"already_ran"`` if the slot was claimed before. A file system failure
        raises :class:`cronlock.LockError`.
        """
        key = _slot_key(job, slot)

        def undo(claimed: _FileHold | Refusal) -> None:
            if isinstance(claimed, _FileHold):
                claimed._abandon()

        # The thread cannot be stopped, so wait for it whatever happens: otherwise a
        # cancelled acquire could leave a lock held by nobody.
        return await claim_or_undo(
            asyncio.to_thread(self._acquire_sync, job, key), undo, name=task_name("flock", job)
        )

    def _lock_path(self, job: str) -> Path:
        return self._directory / f"{_stem(job)}.lock"

    def _ledger_path(self, job: str) -> Path:
        return self._directory / f"{_stem(job)}.ledger"

    def _forget(self, job: str) -> None:
        with self._mutex:
            self._held.discard(job)

    def _acquire_sync(self, job: str, key: str) -> _FileHold | Refusal:
        with self._mutex:
            if job in self._held:
                _logger.debug("job %r is already held by this process", job, extra=at(job))
                return "locked"
            self._held.add(job)
        path = self._lock_path(job)
        fd: int | None = None
        hold: _FileHold | None = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _logger.debug("job %r is held by another process", job, extra=at(job))
                return "locked"
            previous = self._read_ledger(job)
            if key in previous:
                _logger.debug("slot %s of job %r was already claimed", key, job, extra=at(job))
                return "already_ran"
            claimed = dict.fromkeys(previous)
            remember_claim(claimed, key, None, remember=self._remember)
            self._write_ledger(job, list(claimed))
            hold = _FileHold(self, job, fd, previous)
            return hold
        except OSError as exc:
            raise LockError(f"cannot lock job {job!r} at {str(path)!r}: {exc}") from exc
        finally:
            if hold is None:  # refused or failed: give everything back
                if fd is not None:
                    os.close(fd)  # also drops the flock, if we got it
                self._forget(job)

    def _read_ledger(self, job: str) -> list[str]:
        path = self._ledger_path(job)
        try:
            return _parse_ledger(path.read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LockError(f"cannot read ledger of job {job!r} at {str(path)!r}: {exc}") from exc

    def _write_ledger(self, job: str, entries: list[str]) -> None:
        # Write a temporary file and rename it over the ledger: a process killed mid-write
        # leaves the old ledger intact. The fixed temporary name is safe because only the
        # flock holder writes, and mode "w" truncates what a killed writer left behind.
        path = self._ledger_path(job)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with tmp.open("w", encoding="utf-8") as file:
                file.writelines(f"{entry}\n" for entry in entries)
                file.flush()
                os.fsync(file.fileno())  # or a power cut could leave an empty ledger
            os.replace(tmp, path)
        except OSError as exc:
            raise LockError(f"cannot write ledger of job {job!r} at {str(path)!r}: {exc}") from exc
