"""The house rules of the package's structure, checked on its source (docs/internals.md).

No import cycle (``TYPE_CHECKING`` and function-level imports count), no module too long
to read in one sitting, a job's run state changed by one module only, optional
capabilities declared as Protocols rather than probed with ``getattr``/``hasattr``, no SQL
statement outside ``cronlock/postgres/_sql/``, and the folder rules below.

A module holds one concept, split when a second one appears rather than at a line count;
:data:`MAX_LINES` (about 800) only catches a module that has grown past one sitting.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import cronlock

PACKAGE = Path(cronlock.__file__).parent
MAX_LINES = 800  # one concept per module: a backstop, not where to split
# Fields of cronlock._core.state.RunState (the base of Job): assigned in that module and nowhere
# else, not even by Job's own methods.
RUN_STATE_FIELDS = frozenset(
    {
        "_next_run",
        "_raw_last_run",
        "_raw_last_success",
        "_run_count",
        "_paused",
        "_active",
        "_generation",
        "_history_checked",
    }
)
# getattr/hasattr on something that is not a user's callable: at most this many in src.
MAX_PROBES = 3
_INTROSPECTION = frozenset({"__annotations__", "__call__", "__module__", "__qualname__"})


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _imports(name: str, path: Path) -> set[str]:
    """Every cronlock module *name* imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cronlock"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("cronlock"):
                continue
            found.add(target)
            # "from . import x" / "from .pkg import mod" may name submodules.
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = dict(_modules())
    return {
        name: {t for t in _imports(name, path) if t in modules and t != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_too_long_to_read() -> None:
    long = {
        name: n
        for name, path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_run_state_is_written_in_one_module() -> None:
    writers: dict[str, list[int]] = {}
    for name, path in _modules():
        if name == "cronlock._core.state":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if (
                        isinstance(sub, ast.Attribute)
                        and sub.attr in RUN_STATE_FIELDS
                        # Another class's own field of that name (a lease's _generation)
                        # is not a job's; in Job, self is the job.
                        and not (
                            isinstance(sub.value, ast.Name)
                            and sub.value.id == "self"
                            and name != "cronlock._core.job"
                        )
                    ):
                        writers.setdefault(name, []).append(sub.lineno)
    assert writers == {}


def test_capabilities_are_not_probed() -> None:
    probes: list[str] = []
    for name, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value not in _INTROSPECTION
            ):
                probes.append(f"{name}:{node.lineno}:{node.args[1].value!s}")
    assert len(probes) <= MAX_PROBES, probes


# The pure slot maths (docs/internals.md, "schedules"): no clock, no event loop, no I/O.
_SLOT_MATHS = frozenset(
    f"cronlock._schedules.{m}"
    for m in ("tz", "cron", "cron_days", "interval", "calendar", "once", "schedule")
) | {"cronlock._durations"}
# The run machinery ("running", with how a job is wired to the lockers), and the only
# modules outside it that may import it.
_RUN_MACHINERY = frozenset(
    f"cronlock._core.{m}"
    for m in (
        "state", "guard", "admission", "executor", "catchup", "planner", "runloop",
        "recovery", "fleetstate", "fleetclock", "outage", "wiring",
    )
)  # fmt: skip
_RUN_DOORS = {
    "cronlock._scheduler": {
        "_core.fleetclock",
        "_core.fleetstate",
        "_core.recovery",
        "_core.runloop",
        "_core.wiring",
    },
    # A job carries its run state (only state writes it) and its wiring (wire() makes it).
    "cronlock._core.job": {"_core.state", "_core.wiring"},
    "cronlock": {"_core.fleetclock"},  # FleetClock is public
    # The fleet simulation seeds the planner's draws (a replay must draw the same).
    "cronlock._sim.world": {"_core.planner"},
}


def _outside_imports(path: Path) -> set[str]:
    """The top-level names of the modules *path* imports that are not cronlock's."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found - {"cronlock", "__future__"}


def test_the_slot_maths_is_pure() -> None:
    graph, paths = _graph(), dict(_modules())
    leaks = {m: sorted(graph[m] - _SLOT_MATHS - {"cronlock._errors"}) for m in _SLOT_MATHS}
    assert {m: v for m, v in leaks.items() if v} == {}
    io = {"asyncio", "anyio", "asyncpg", "socket", "threading", "time"}
    assert {m: sorted(_outside_imports(paths[m]) & io) for m in _SLOT_MATHS} == {
        m: [] for m in _SLOT_MATHS
    }


def test_the_run_machinery_has_few_doors() -> None:
    graph = _graph()
    doors = {
        m: {t.removeprefix("cronlock.") for t in targets & _RUN_MACHINERY}
        for m, targets in graph.items()
        if m not in _RUN_MACHINERY and targets & _RUN_MACHINERY
    }
    assert doors == _RUN_DOORS


# -- SQL has one home ----------------------------------------------------------------------

_SQL_HOME = "cronlock.postgres._sql"
# A statement's first word, upper case, then a space or a newline.
_STATEMENT = re.compile(r"\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER)[ \n]")


def _statements(source: str) -> list[int]:
    """The lines of the string literals and f-strings of *source* that start like a SQL
    statement (an f-string by its first literal part)."""
    tree = ast.parse(source)
    parts = {
        id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values
    }
    lines = []
    for node in ast.walk(tree):
        if id(node) in parts:
            continue  # read with its f-string
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            text = first.value if isinstance(first, ast.Constant) else None
        elif isinstance(node, ast.Constant):
            text = node.value
        else:
            continue
        if isinstance(text, str) and _STATEMENT.match(text):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_sql_scan_finds_statements() -> None:
    source = '''
a = "SELECT 1"
b = f"""
    UPDATE {t} SET x = 1"""
c = ("WITH x AS (SELECT 1) "
     "SELECT * FROM x")
d = f"{cte} SELECT 1"  # starts with a value: not seen
e = "Selected", "UPDATED", "INSERT", "update t"
'''
    assert _statements(source) == [2, 3, 5]


def test_sql_lives_in_postgres_sql() -> None:
    found = {
        name: lines
        for name, path in _modules()
        if name != _SQL_HOME
        and not name.startswith(_SQL_HOME + ".")
        and (lines := _statements(path.read_text()))
    }
    assert found == {}


# -- the folder rules (docs/internals.md): a module is covered by the folder it is put in ----

_LEAVES = frozenset(
    f"cronlock.{m}"
    for m in (
        "_errors", "_records", "_events", "_clock", "_cancel", "_logs", "_durations", "_keys",
        "_threads", "_dsn", "_terminal", "_names", "_resources",
    )
)  # fmt: skip


def _in(module: str, folder: str) -> bool:
    return module == folder or module.startswith(f"{folder}.")


def _crossing(importer: str, imported: str) -> set[tuple[str, str]]:
    """Every import of a module in *imported* by a module in *importer* (folders)."""
    return {
        (m, t)
        for m, targets in _graph().items()
        if _in(m, importer)
        for t in targets
        if _in(t, imported) and not _in(m, imported)
    }


def test_the_slot_maths_imports_only_itself_and_two_leaves() -> None:
    allowed = {"cronlock._schedules", "cronlock._errors", "cronlock._durations"}
    leaks = {
        (m, t)
        for m, targets in _graph().items()
        if _in(m, "cronlock._schedules")
        for t in targets
        if not any(_in(t, a) for a in allowed)
    }
    assert leaks == set()


def test_the_run_engine_has_few_importers() -> None:
    doors = {"cronlock", "cronlock._scheduler", "cronlock._stored", "cronlock._core"}
    doors.add("cronlock._sim.world")  # seeds the planner's draws (see _RUN_DOORS)
    importers = {
        m
        for m, targets in _graph().items()
        if any(_in(t, "cronlock._core") for t in targets)
        and not any(_in(m, d) for d in doors if d != "cronlock")
        and m != "cronlock"
    }
    assert importers == set()


def test_the_replica_side_never_imports_the_operators_side() -> None:
    assert _crossing("cronlock.postgres._locker", "cronlock.postgres._ops") == set()


def test_the_replica_side_knows_the_modes_only_by_their_seam() -> None:
    seam = {"cronlock.postgres._modes", "cronlock.postgres._modes.base"}
    assert {
        (m, t) for m, t in _crossing("cronlock.postgres._locker", "cronlock.postgres._modes")
        if t not in seam
    } == set()  # fmt: skip


def test_the_modes_never_import_the_replica_side() -> None:
    assert _crossing("cronlock.postgres._modes", "cronlock.postgres._locker") == set()


def test_the_sql_home_imports_nothing_of_the_backend() -> None:
    backend = {
        t
        for m, targets in _graph().items()
        if _in(m, "cronlock.postgres._sql")
        for t in targets
        if _in(t, "cronlock.postgres") and not _in(t, "cronlock.postgres._sql")
    }
    assert backend == set()


def _names_in(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.alias):
            yield getattr(node, "lineno", 0), node.name


# What names the backend's error types: asyncpg's classes, and the connection layer's sets.
_BACKEND_ERRORS = re.compile(
    r"^(backend_error_types|gone_or_failed_types|PostgresError|InterfaceError|"
    r"InternalClientError|\w+Error)$"
)


def test_only_the_connection_layer_names_backend_error_types() -> None:
    found = []
    for name, path in _modules():
        # The simulated server (cronlock._sim) plays the backend: it raises asyncpg's errors.
        if _in(name, "cronlock.postgres._conn") or _in(name, "cronlock._sim"):
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            named = None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "asyncpg" and node.attr.endswith("Error"):
                    named = f"asyncpg.{node.attr}"
            elif isinstance(node, ast.Name | ast.alias):
                ident = node.id if isinstance(node, ast.Name) else node.name
                if ident in ("backend_error_types", "gone_or_failed_types"):
                    named = ident
            if named is not None:
                found.append(f"{name}:{getattr(node, 'lineno', 0)}: {named}")
    assert found == []


_MODES = {"session", "lease"}
_MODE_FLAGS = {"session_bound", "_session_locks"}  # flags that stood for a mode


def test_only_the_mode_seam_reads_the_mode() -> None:
    """No comparison with a mode's name, and no flag standing for one, outside _modes."""
    found = []
    for name, path in _modules():
        if _in(name, "cronlock.postgres._modes"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for operand in (node.left, *node.comparators):
                    values: list[object] = []
                    if isinstance(operand, ast.Constant):
                        values = [operand.value]
                    elif isinstance(operand, ast.Tuple | ast.Set | ast.List):
                        values = [e.value for e in operand.elts if isinstance(e, ast.Constant)]
                    if _MODES & {v for v in values if isinstance(v, str)}:
                        found.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.Attribute) and node.attr in _MODE_FLAGS:
                found.append(f"{name}:{node.lineno}: {node.attr}")
    assert found == []


_LEDGER_NAMES = {"table", "_table", "ledger", "_ledger", "exclusion", "_exclusion"}
_REPLICA_SIDE = ("_locker", "_conn", "_elector")


def test_no_ledger_is_none_branches_outside_the_mode_seam() -> None:
    """ledger=False is the bare mode's: the backend's parts never ask whether there is one."""
    found = []
    for name, path in _modules():
        # The replica side: the operators' side and locked_run always have a ledger, or
        # are told whether to use one by their caller's arguments.
        if not any(_in(name, f"cronlock.postgres.{part}") for part in _REPLICA_SIDE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Compare)
                and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops)
                and any(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)
            ):
                subject = node.left
                ident = (
                    subject.id if isinstance(subject, ast.Name)
                    else subject.attr if isinstance(subject, ast.Attribute) else None
                )  # fmt: skip
                if ident in _LEDGER_NAMES:
                    found.append(f"{name}:{node.lineno}: {ident}")
    assert found == []


def test_private_folders_re_export_nothing() -> None:
    """A private folder's __init__ defines what it holds and imports none of its modules
    at import time (each would load with any of them: import cost, and cycles)."""
    found = []
    for name, path in _modules():
        if path.name != "__init__.py" or not name.rpartition(".")[2].startswith("_"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found.append(f"{name}:{node.lineno}")
    assert found == []
