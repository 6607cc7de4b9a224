"""The house rules of the package's structure, checked on its source (docs/internals.md).

No import cycle (``TYPE_CHECKING`` and function-level imports count), no module too long
to read in one sitting, a job's run state changed by one module only, and optional
capabilities declared as Protocols rather than probed with ``getattr``/``hasattr``.

A module holds one concept, split when a second one appears rather than at a line count;
:data:`MAX_LINES` (about 800) only catches a module that has grown past one sitting.
"""

from __future__ import annotations

import ast
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
        "recovery", "fleetstate", "fleetclock", "wiring",
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
