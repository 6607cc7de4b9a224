"""What an operator sees of the fleet: ``python -m cronlock status --check``, run by the
library's own code at given virtual instants, on a process of its own.

The verb's code is run as it is (``cronlock.postgres._ops.cli``: its arguments parsed by
the real command line's parser, the ledger's state looked at, every job read and judged,
the table printed, the exit status); only its connection differs: where the command
line connects to a DSN, it gets a connection to the world's server, from its own
simulated process (``operator``), as a replica gets one from its connector. What it
printed is read back as a user reads it: each job's STATE column, the states
``--check`` names, its exit status. Nothing here judges a job: the oracle gets the texts.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .conn import SimConnector, TrackedConnector

if TYPE_CHECKING:
    from .fleet import Fleet
    from .world import Process

__all__ = ("Reading", "Verdicts", "parse_status")

COMMAND = ("status", "--check")
"""The command an operator runs (``python -m cronlock status --check``)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One run of ``status --check``: when (seconds into the run), what it said."""

    at: float
    states: dict[str, str]
    """Each job's STATE column."""
    check: dict[str, str]
    """The jobs ``--check`` names as failing, with the state it names (``overdue``)."""
    status: int | None
    """The exit status (``None``: the verb raised; :attr:`output` says what)."""
    output: str

    def verdict(self, job: str) -> str:
        """What the check says of *job*: the state it fails it for, else ``ok`` when the
        check passes it (its STATE column then tells more, as ``failing`` or ``new``);
        ``unknown`` when the status does not list the job."""
        if job in self.check:
            return self.check[job]
        return "ok" if job in self.states else "unknown"

    def verdicts(self) -> dict[str, str]:
        """:meth:`verdict` of every job the status lists or the check names."""
        return {job: self.verdict(job) for job in {**self.states, **self.check}}


def parse_status(output: str) -> tuple[dict[str, str], dict[str, str]]:
    """The STATE column of each job of ``status``'s table, and the ``state: job, job``
    lines ``--check`` prints for the jobs it fails, from what the verb printed."""
    lines = output.splitlines()
    states: dict[str, str] = {}
    check: dict[str, str] = {}
    header = next((i for i, line in enumerate(lines) if line.startswith("JOB ")), None)
    rest = lines
    if header is not None:
        titles = lines[header]
        starts = [titles.index(t) for t in ("JOB", "STATE", "SCHEDULE")]
        rest = lines[header + 1 :]
        table = []
        for line in rest:
            if len(line) <= starts[2] or line[starts[1] - 2 : starts[1]] != "  ":
                break  # the table ends where a line no longer has its columns
            table.append(line)
            states[line[: starts[1]].strip()] = line[starts[1] : starts[2]].strip()
        rest = rest[len(table) :]
    for line in rest:
        state, sep, names = line.partition(": ")
        if sep and state.isidentifier() and state.islower():
            for name in names.split(", "):
                check[name] = state
    return states, check


@dataclass(slots=True)
class Verdicts:
    """``status --check`` read at each of *at* (seconds into the run) in *fleet*'s world,
    from a process of its own; :attr:`readings` fill as the world runs."""

    fleet: Fleet
    at: Sequence[float]
    readings: list[Reading] = field(default_factory=list)
    process: Process | None = None

    def __post_init__(self) -> None:
        world = self.fleet.world
        self.process = world.spawn("operator")
        for when in self.at:
            world.call_at(when, self._start, when)

    def _start(self, when: float) -> None:
        process = self.process
        assert process is not None
        process.loop.create_task(self._read(when), name=f"status-check@{when:g}")

    async def _read(self, when: float) -> None:
        from .._cli.main import _build_parser
        from ..postgres._ops import cli
        from ..postgres._sql.tables import LedgerTable

        assert self.process is not None
        connector = TrackedConnector(self.fleet.world, self.process)
        args = _build_parser().parse_args([*COMMAND, "--table", self.fleet.table.table])
        # What run_pg and run_verb do before the verb (its DSN, its --state).
        args.dsn, args.dsn_source = "postgresql://simulated", "--dsn"
        args.states = cli._states(args.state or [])
        table = LedgerTable(args.table, args.schema)
        out = io.StringIO()
        status: int | None = None
        with _connecting(cli, connector), _printing_to(cli, out):
            try:
                status = await cli._guarded(args, table, cli._run(args, table))
            except Exception as exc:  # what the command line would print, and exit 3 or 1
                print(f"ERROR {type(exc).__name__}: {exc}", file=out)
        text = out.getvalue()
        states, check = parse_status(text)
        self.readings.append(Reading(when, states, check, status, text))


@contextlib.contextmanager
def _connecting(cli: Any, connector: SimConnector) -> Iterator[None]:
    """The verb connects through *connector* instead of to a DSN (its one difference)."""
    saved = cli._connect

    async def connect(dsn: str | None, source: str) -> Any:
        return await connector.connect(10.0)

    cli._connect = connect
    try:
        yield
    finally:
        cli._connect = saved


@contextlib.contextmanager
def _printing_to(cli: Any, out: io.StringIO) -> Iterator[None]:
    """What the verb prints (every line goes through its ``_print``, to stdout or stderr)
    goes to *out* instead."""
    saved = cli._print

    def to_out(*values: object, file: Any = None) -> None:
        saved(*values, file=out)

    cli._print = to_out
    try:
        yield
    finally:
        cli._print = saved
