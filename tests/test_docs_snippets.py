"""Every Python snippet in README.md and docs/ runs, as written, to completion.

Each ```` ```python ```` block is one test: it is compiled with top-level ``await`` allowed
(so ``async with scheduler:`` works as it reads on the page) and run in a fresh namespace
on the test's event loop, under a 30 s limit. A block that defines ``test_*`` coroutine
functions has them awaited afterwards, as pytest would. Warnings are errors here as
everywhere in the suite, so a snippet that leaks a connection or a task fails.

An HTML comment on the line just before a block (invisible on GitHub and on the site)
changes how it runs:

- ``<!-- snippet: postgres -->``: the block gets ``dsn`` (a DSN whose ``search_path`` is a
  throwaway schema of the test session, see ``tests/postgres/conftest.py``) and ``pool``
  (an asyncpg pool on it, closed after the block). Needs ``CRONLOCK_TEST_DSN`` or another
  server the PostgreSQL tests can find.
- ``<!-- snippet: skip REASON -->``: not run, for the few blocks that cannot be (a
  ``Protocol`` outline, a sketch of a class body). The reason is mandatory, and the number
  of skipped blocks is capped below so that skipping does not become the easy way out.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .postgres.conftest import pg_dsn, pg_server  # noqa: F401  (fixtures for postgres blocks)

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_AT_MOST = 6
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<kind>\w+)\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    """One fenced Python block of a markdown file."""

    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    marker: str  # "", "postgres" or "skip"
    reason: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    """README.md and every page under docs/ (the site's tools excluded)."""
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "_tools" not in p.parts]
    return [ROOT / "README.md", *pages]


def snippets(path: Path) -> Iterator[Snippet]:
    """The Python blocks of one markdown file, with the marker just before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening["fence"], opening["info"].strip().split()
        indent = len(opening["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        if info and info[0] in {"python", "py"}:
            previous = lines[i - 1] if i > 0 else ""
            marker = _MARKER.match(previous)
            yield Snippet(
                path=path,
                line=i + 1,
                code="\n".join(body) + "\n",
                marker=marker["kind"] if marker else "",
                reason=marker["reason"] if marker else "",
            )
        i = j + 1


ALL = [s for path in markdown_files() for s in snippets(path)]


def test_the_snippets_were_found() -> None:
    files = {s.path.name for s in ALL}
    assert {"README.md", "testing.md", "getting-started.md"} <= files
    assert len(ALL) >= 20


def test_few_snippets_are_skipped_and_each_says_why() -> None:
    skipped = [s for s in ALL if s.marker == "skip"]
    assert len(skipped) <= SKIPPED_AT_MOST, [s.id for s in skipped]
    assert all(s.reason for s in skipped), [s.id for s in skipped if not s.reason]
    unknown = [s.id for s in ALL if s.marker not in {"", "skip", "postgres"}]
    assert not unknown


async def run_snippet(snippet: Snippet, namespace: dict[str, Any]) -> None:
    """Compile and run one block, then await the ``test_*`` coroutines it defined."""
    code = compile(snippet.code, str(snippet.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    # Line numbers in a traceback point into the markdown file.
    code = code.replace(co_firstlineno=snippet.line + 1)
    result = eval(code, namespace)
    if inspect.iscoroutine(result):
        await result
    for name, value in list(namespace.items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(value):
            await value()


@pytest.mark.parametrize(
    "snippet", [s for s in ALL if s.marker in {"", "skip"}], ids=lambda s: s.id
)
async def test_snippet_runs(snippet: Snippet) -> None:
    if snippet.marker == "skip":
        pytest.skip(f"marked skip: {snippet.reason}")
    async with asyncio.timeout(30):
        await run_snippet(snippet, {"__name__": "__snippet__"})


@pytest.mark.postgres
@pytest.mark.parametrize("snippet", [s for s in ALL if s.marker == "postgres"], ids=lambda s: s.id)
async def test_postgres_snippet_runs(snippet: Snippet, pg_dsn: str) -> None:  # noqa: F811
    import asyncpg

    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=10)
    try:
        async with asyncio.timeout(30):
            await run_snippet(snippet, {"__name__": "__snippet__", "dsn": pg_dsn, "pool": pool})
    finally:
        async with asyncio.timeout(10):
            await pool.close()
