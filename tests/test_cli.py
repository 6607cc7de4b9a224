"""The command line: ``python -m cronlock ...``.

Run as users run it, in a process of its own (:func:`cronlock`), where the process is the
point: the exit status a shell sees, a reader that goes away, live output, one case of each
verb family's usage errors. Elsewhere its ``main()`` is called in this process
(:func:`cronlock_here`): the same arguments, stdout, stderr, log and exit status, without
an interpreter start and its imports (most of a second each).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from importlib.metadata import version

import pytest

from cronlock._cli.main import main

# Nothing listens on port 9 (discard) here: a DSN that fails at once.
UNREACHABLE = "postgresql://nobody@127.0.0.1:9/none"


def cronlock(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronlock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


class _ThisThread(logging.Handler):
    """What a process of its own prints of its log (Python's last resort: WARNING and up,
    the bare message, on stderr), for the records of one thread only: the command line's,
    not those of anything else running in this process meanwhile."""

    def __init__(self, stream: io.StringIO) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter())
        self._stream = stream
        self._thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread:
            self._stream.write(self.format(record) + "\n")  # with a traceback, if any


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_ONE_AT_A_TIME = threading.Lock()  # sys.stdout, sys.stderr and os.environ are the process's


def main_here(
    args: tuple[str, ...] | list[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``main(args)`` in this thread, as a process of its own would show it: exit status,
    stdout, stderr (with its log's warnings); *env*, if given, the whole environment
    meanwhile. Not on a running event loop (the ledger verbs run one of their own), and not
    for ``web`` or ``celery-beat`` (they wait for a signal). What a process says once (a
    ledger row it cannot read, say) it may have said already here; and pytest's live log
    (``--log-cli-level``) swaps ``sys.stdout`` while others log: neither for those."""
    out, err = io.StringIO(), io.StringIO()
    log = _ThisThread(err)
    with _ONE_AT_A_TIME, _environment(env):
        logging.getLogger().addHandler(log)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    status = main(list(args))
                except SystemExit as exc:  # argparse: --help, --version, a usage error
                    code = exc.code
                    status = code if isinstance(code, int) else (0 if code is None else 1)
        finally:
            logging.getLogger().removeHandler(log)
    return subprocess.CompletedProcess(["cronlock", *args], status, out.getvalue(), err.getvalue())


def cronlock_here(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """:func:`cronlock`'s answer from ``main()`` in this process (*env* added to it)."""
    return main_here(args, None if env is None else {**os.environ, **env})


def test_help_lists_only_the_public_verbs() -> None:
    result = cronlock("--help")
    assert result.returncode == 0, result.stderr
    verbs = (
        "{next,demo,migrate,status,history,pause,resume,trigger,retire,schedules,grants,web,"
        "celery-beat}"
    )
    assert verbs in result.stdout
    assert "_replica" not in result.stdout
    assert "SUPPRESS" not in result.stdout
    assert "--version" in result.stdout


def test_version() -> None:
    result = cronlock_here("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"cronlock {version('cronlock')}\n"


def test_next_prints_local_and_utc_slots() -> None:
    result = cronlock_here(
        "next",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "-n",
        "3",
        "--after",
        "2026-03-07T00:00:00+00:00",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:] == [
        "  2026-03-07 02:30 EST    (-0500)  =  2026-03-07 07:30 UTC",
        # 02:30 does not exist on spring-forward day: once, right after the gap.
        "  2026-03-08 03:00 EDT    (-0400)  =  2026-03-08 07:00 UTC",
        "  2026-03-09 02:30 EDT    (-0400)  =  2026-03-09 06:30 UTC",
    ]


def test_next_with_seconds_field_first() -> None:
    result = cronlock_here(
        "next", "15 0 3 * * *", "--seconds", "-n", "1", "--after", "2026-01-01T00:00:00+00:00"
    )
    assert result.returncode == 0, result.stderr
    assert "2026-01-01 03:00:15 UTC" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("next", "0 3 * *"), "expected 5 fields"),
        (("next", "0 25 * * *"), "25"),
        (("next", "0 0 31 2 *"), "never fires"),
        (("next", "@daily", "--tz", "Mars/Olympus"), "Mars/Olympus"),
        (("next", "@daily", "--tz", "EST"), "--tz='EST' is a fixed offset of -05:00"),
        (("next", "@daily", "-n", "0"), "-n must be between 1 and 10000, got 0"),
        (("next", "@daily", "-n", "5000000"), "-n must be between 1 and 10000, got 5000000"),
        (("next", "@daily", "--after", "yesterday"), "--after: 'yesterday' is not an ISO 8601"),
        (("next", "@daily", "--after", "2026-13-01T00:00"), "--after: '2026-13-01T00:00'"),
        (("next", "@daily", "--after", "9999-12-31T23:00", "--tz", "America/New_York"), "--after"),
        (("next", "0 0 3 * * *"), "pass --seconds for a leading seconds field"),
        (("next", "0 3 * * *", "--seconds"), "leave out --seconds"),
        (("demo", "--skew", "3"), "--skew must be between 0 and 2"),
        (("demo", "--lock-only", "--locker", "file"), "--lock-only needs PostgreSQL"),
    ],
)
def test_bad_input_is_one_clear_line_and_status_2(args: tuple[str, ...], needle: str) -> None:
    result = cronlock_here(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("cronlock: error: ")
    assert needle in line
    assert "seconds=True" not in line  # the library's spelling, not the command line's
    assert "datetime.datetime" not in line
    assert line.count("--after:") <= 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("next", "0 25 * * *"), "cronlock: error: "),
        (("history", "j", "--dsn", UNREACHABLE, "-n", "0"), "cronlock history: error: argument -n"),
    ],
    ids=["next", "history"],
)
def test_a_usage_error_in_a_process_of_its_own(args: tuple[str, ...], said: str) -> None:
    """The exit status a shell sees, and one line on stderr (the other cases call main())."""
    result = cronlock(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(said), line


def test_naive_after_is_a_wall_time_in_tz() -> None:
    # 00:30 in Berlin is 23:30 UTC the day before: the 01:00 slot half an hour later is next.
    # (Read as UTC, 00:30 would be 01:30 in Berlin, and the next slot a day later.)
    result = cronlock_here(
        "next", "0 1 * * *", "--tz", "Europe/Berlin", "-n", "1", "--after", "2026-03-29T00:30"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "  2026-03-29 01:00 CET    (+0100)  =  2026-03-29 00:00 UTC"
    ]


def test_naive_after_defaults_to_utc() -> None:
    result = cronlock_here("next", "@daily", "-n", "1", "--after", "2026-03-29T01:00")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "  2026-03-30 00:00 UTC    (+0000)  =  2026-03-30 00:00 UTC"
    ]


@pytest.mark.parametrize(
    ("args", "printed"),
    [
        (("@daily", "-n", "5", "--after", "9999-12-30T00:00Z"), 1),
        (("@daily", "-n", "10000", "--after", "9999-12-01T00:00Z"), 30),
        (("@daily", "--after", "9999-12-31T12:00Z"), 0),
        (("0 3 * * *", "--tz", "America/New_York", "--after", "9999-12-30T00:00Z"), 2),
    ],
)
def test_the_end_of_the_calendar_stops_cleanly(args: tuple[str, ...], printed: int) -> None:
    result = cronlock_here("next", *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"next {printed} slot(s) of ")
    assert len(lines) == printed + 2
    assert lines[-1].startswith("stopped: no slot after 9999-12-")
    assert lines[-1].endswith("(the calendar ends at 9999-12-31 23:59:59 UTC)")


SLOT_LINE = re.compile(r"  \d\d:\d\d:\d\d  ")


def _slot_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if SLOT_LINE.match(line)]


def test_demo_with_file_locks_prints_each_slot_as_it_happens() -> None:
    args = ["demo", "--replicas", "3", "--duration", "4", "--locker", "file"]
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "cronlock", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        arrivals = [(time.monotonic() - started, line.rstrip("\n")) for line in proc.stdout]
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    lines = [line for _, line in arrivals]
    assert lines[0].startswith("backend: FileLocker")
    assert lines[1].startswith("3 replica(s), job 'cronlock-demo-tick' every second for 4s")
    slots = [(t, line) for t, line in arrivals if SLOT_LINE.match(line)]
    assert len(slots) == 4
    for _, line in slots:
        # Exactly one replica ran it; the other two say why they did not.
        assert re.fullmatch(
            r"  \d\d:\d\d:\d\d  ran on replica-[123]  skipped: "
            r"replica-\d \((locked|already ran)\), replica-\d \((locked|already ran)\)",
            line,
        ), line
    # Live: the slots come about a second apart, the first well before the end.
    assert arrivals[-1][0] - slots[0][0] > 2.5
    assert lines[-1] == "slots 4, runs 4, duplicates 0, missed 0"


def test_demo_with_skewed_clocks_and_file_locks_runs_each_slot_once() -> None:
    result = cronlock_here(
        "demo", "--replicas", "3", "--duration", "3", "--locker", "file", "--skew", "0.3"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "clocks +0.00s, -0.30s, -0.60s" in result.stdout.splitlines()[1]
    slots = _slot_lines(result.stdout)
    assert len(slots) == 3
    # Replicas behind find the slot in the file ledger.
    assert all("(already ran)" in line for line in slots)
    assert result.stdout.splitlines()[-1] == "slots 3, runs 3, duplicates 0, missed 0"


def test_demo_falls_back_to_file_locks_and_says_why() -> None:
    result = cronlock_here(
        "demo", "--replicas", "2", "--duration", "2", env={"CRONLOCK_DSN": UNREACHABLE}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    first, why = result.stdout.splitlines()[:2]
    assert first.startswith("backend: FileLocker")
    assert why.startswith("  not PostgreSQL: cannot connect to PostgreSQL with CRONLOCK_DSN: ")
    assert result.stdout.splitlines()[-1] == "slots 2, runs 2, duplicates 0, missed 0"


def test_demo_with_unreachable_database_is_one_line_and_status_2() -> None:
    result = cronlock("demo", "--dsn", UNREACHABLE, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot connect to PostgreSQL with --dsn" in result.stderr


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (str(2**63), f"must be from 1 to 10000, got '{2**63}'"),
        ("0", "must be from 1 to 10000, got '0'"),
        ("10001", "must be from 1 to 10000, got '10001'"),
        ("9" * 5000, "not a whole number: '999999999999999999999999999999'... (5000 characters)"),
        ("ten", "not a whole number: 'ten'"),
    ],
    ids=["2**63", "zero", "10001", "5000-digits", "word"],
)
def test_history_n_out_of_bounds_is_a_usage_error_before_connecting(given: str, said: str) -> None:
    """Exit status 2 and one line naming -n and the value; not a traceback from the driver
    (2**63 is past the server's bigint), and not a connection attempt."""
    result = cronlock_here("history", "j", "--dsn", UNREACHABLE, "-n", given)
    assert result.returncode == 2
    assert result.stderr == f"cronlock history: error: argument -n: {said}\n"
    assert result.stdout == ""


def test_a_reader_that_goes_away_is_not_an_error() -> None:
    """`python -m cronlock next ... | head -1` (issue 36, item 8): the reader closes the pipe
    after one line; the command ends quietly (status 141, as SIGPIPE), no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "cronlock", "next", "* * * * *", "-n", "10000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"next 10000 slot(s)")
    proc.stdout.close()  # the reader goes away
    errors = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert b"Traceback" not in errors and b"BrokenPipeError" not in errors, errors


def test_grants_prints_one_statement_a_line_for_each_role() -> None:
    result = cronlock_here("grants", "--schema", "app", "--reader", 'ro "x"', "--mode", "lease")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(line.startswith("-- ") or (line.startswith("GRANT ") and line.endswith(";"))
               for line in lines), lines  # fmt: skip
    assert [line for line in lines if line in ("-- replica", "-- operator", "-- reader")] == [
        "-- replica", "-- operator", "-- reader",
    ]  # fmt: skip
    assert 'GRANT SELECT ON TABLE "app"."cronlock_runs" TO "ro ""x""";' in lines
    leases = (
        'GRANT SELECT, INSERT, UPDATE ON TABLE "app"."cronlock_runs_leases" TO "cronlock_replica";'
    )
    assert leases in lines
    # No role but the operator's (and, with --keyed, the replicas') reads the secrets.
    secrets = [line for line in lines if "cronlock_runs_secrets" in line]
    assert secrets == [
        'GRANT SELECT, INSERT ON TABLE "app"."cronlock_runs_secrets" TO "cronlock_operator";'
    ]


def test_grants_refuses_a_name_that_would_break_out_of_a_line() -> None:
    # In a process of its own: the exit status and the escaped name as a shell sees them.
    result = cronlock("grants", "--reader", "ro\nDROP TABLE x; --")
    assert result.returncode == 2
    assert result.stdout == "" and "control character" in result.stderr
