"""Every Python snippet in README.md and docs/ runs, as written, to completion.

Each ```` ```python ```` block is one test, run as ``python block.py`` would run it
(``__name__ == "__main__"``), under a 30 s limit:

- a block with top-level ``await`` (``async with scheduler:`` as it reads on the page) is
  compiled with top-level await allowed and awaited on the test's event loop;
- any other block runs in a worker thread, so that its own ``asyncio.run(main())`` works;
- a block that defines ``test_*`` coroutine functions has them awaited afterwards, as
  pytest would.

Warnings are errors here as everywhere in the suite, so a snippet that leaks a connection
or a task fails. An HTML comment on the line just before a block (invisible on GitHub and
on the site) changes how it runs:

- ``<!-- snippet: postgres -->``: the block gets ``dsn`` (a DSN whose ``search_path`` is a
  throwaway schema of the test session, see ``tests/postgres/conftest.py``), ``pool`` (an
  asyncpg pool on it, closed after the block) and ``DATABASE_DSN`` in the environment (the
  same DSN). Needs ``CRONLOCK_TEST_DSN`` or another server the PostgreSQL tests can find.
- ``<!-- snippet: redis -->``: the block gets ``redis_url`` (the Redis server of the queue
  tests, ``tests/brokers.py``) and ``queue``, a queue name of its own; every key whose name
  holds it (and the arq jobs waiting in it) is deleted after the block. Fails under ``CI``
  when no Redis answers, else skips.
- ``<!-- snippet: continue -->``: the block goes on from the one before it on the page: it
  runs after that one (and whatever that one continued), in the same namespace. Combine
  them as ``<!-- snippet: continue postgres -->``.
- ``<!-- snippet: skip REASON -->``: not run, for the few blocks that cannot be (a
  signature, an outline of protocols). The reason is mandatory, and the number of skipped
  blocks is capped below so that skipping does not become the easy way out.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cronlock.postgres import run_locked

from .brokers import redis_url, unique
from .postgres.conftest import pg_dsn, pg_server  # noqa: F401  (fixtures for postgres blocks)

# The snippets of a page, and some of one page's with another's, share the session's
# schema (a job one page notes, another pauses): under xdist they stay on one worker, in
# their order.
pytestmark = pytest.mark.xdist_group("docs-snippets")

ROOT = Path(__file__).resolve().parent.parent
_ONCE = datetime(2000, 1, 1, tzinfo=UTC)  # one slot, long past: claimed once per session


async def _nothing() -> None:
    pass


SKIPPED_AT_MOST = 6
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<words>.*?)\s*-->\s*$")
FLAGS = {"postgres", "continue", "redis"}


@dataclass(frozen=True)
class Snippet:
    """One fenced Python block of a markdown file."""

    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    flags: frozenset[str]  # from the marker: "postgres", "continue", "skip"
    reason: str  # why a skipped block is skipped
    previous: Snippet | None  # the block before it on the page

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def chain(self) -> list[Snippet]:
        """The blocks to run for this one: those it continues, then itself."""
        if "continue" in self.flags and self.previous is not None:
            return [*self.previous.chain, self]
        return [self]

    @property
    def needs_postgres(self) -> bool:
        return any("postgres" in s.flags for s in self.chain)

    @property
    def needs_redis(self) -> bool:
        return any("redis" in s.flags for s in self.chain)


def markdown_files() -> list[Path]:
    """README.md and every page under docs/ (the site's tools excluded)."""
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "_tools" not in p.parts]
    return [ROOT / "README.md", *pages]


def snippets(path: Path) -> Iterator[Snippet]:
    """The Python blocks of one markdown file, with the marker just before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    previous: Snippet | None = None
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
            marker = _MARKER.match(lines[i - 1]) if i > 0 else None
            words = marker["words"].split() if marker else []
            skip = bool(words) and words[0] == "skip"
            previous = Snippet(
                path=path,
                line=i + 1,
                code="\n".join(body) + "\n",
                flags=frozenset(["skip"] if skip else words),
                reason=" ".join(words[1:]) if skip else "",
                previous=previous,
            )
            yield previous
        i = j + 1


ALL = [s for path in markdown_files() for s in snippets(path)]


def test_the_snippets_were_found() -> None:
    files = {s.path.name for s in ALL}
    assert {"README.md", "testing.md", "getting-started.md"} <= files
    assert len(ALL) >= 20


def test_few_snippets_are_skipped_and_each_says_why() -> None:
    skipped = [s for s in ALL if "skip" in s.flags]
    assert len(skipped) <= SKIPPED_AT_MOST, [s.id for s in skipped]
    assert all(s.reason for s in skipped), [s.id for s in skipped if not s.reason]
    unknown = [s.id for s in ALL if not s.flags <= FLAGS | {"skip"}]
    assert not unknown, "unknown snippet markers"
    orphans = [s.id for s in ALL if "continue" in s.flags and s.previous is None]
    assert not orphans, "continue on the first block of a page"


async def run_snippet(snippet: Snippet, namespace: dict[str, Any]) -> None:
    """Compile and run one block, then await the ``test_*`` coroutines it defined."""
    code = compile(snippet.code, str(snippet.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    # Line numbers in a traceback point into the markdown file.
    code = code.replace(co_firstlineno=snippet.line + 1)
    if code.co_flags & inspect.CO_COROUTINE:
        await eval(code, namespace)
    else:
        await asyncio.to_thread(exec, code, namespace)
    for name, value in list(namespace.items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(value):
            await value()
            del namespace[name]


async def run_chain(snippet: Snippet, namespace: dict[str, Any]) -> None:
    namespace.setdefault("__name__", "__main__")
    async with asyncio.timeout(30):
        for block in snippet.chain:
            await run_snippet(block, namespace)


def check_shown_only(snippet: Snippet) -> None:
    """A ``Name(params)`` block is checked against ``cronlock.Name``'s signature."""
    text = snippet.code.strip()
    name, _, rest = text.partition("(")
    if name.isidentifier() and text.endswith(")"):
        shown = ast.parse(f"def {name}({rest[:-1]}): pass").body[0]
        assert isinstance(shown, ast.FunctionDef)
        args = shown.args
        documented = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        import cronlock

        actual = list(inspect.signature(getattr(cronlock, name)).parameters)
        assert documented == actual, f"{snippet.id}: the page shows {name}{documented}"
        return
    compile(text, str(snippet.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("snippet", [s for s in ALL if not s.needs_postgres], ids=lambda s: s.id)
async def test_snippet_runs(snippet: Snippet) -> None:
    if "skip" in snippet.flags:
        # Not runnable as written (its reason is on the page), but it must not rot: a
        # signature must match the code's, anything else must still parse.
        check_shown_only(snippet)
        return
    if snippet.needs_redis:
        await run_with_redis(snippet)
        return
    await run_chain(snippet, {})


async def run_with_redis(snippet: Snippet) -> None:
    """Run a ``redis`` block with ``redis_url`` and a ``queue`` of its own, then delete
    what it left on the shared server: the keys that name its queue, the arq jobs in it."""
    from redis.asyncio import Redis

    url, queue = redis_url(), unique("docs")
    try:
        await run_chain(snippet, {"redis_url": url, "queue": queue})
    finally:
        client = Redis.from_url(url)
        try:
            names = [name async for name in client.scan_iter(match=f"*{queue}*")]
            if await client.type(queue) == b"zset":  # arq's queue: its jobs' ids
                ids = [i.decode() for i in await client.zrange(queue, 0, -1)]
                names += [f"arq:{kind}:{i}" for i in ids for kind in ("job", "result")]
            if names:
                await client.delete(*names)
        finally:
            await client.aclose()


@pytest.mark.postgres
@pytest.mark.parametrize("snippet", [s for s in ALL if s.needs_postgres], ids=lambda s: s.id)
async def test_postgres_snippet_runs(
    snippet: Snippet,
    pg_dsn: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncpg

    monkeypatch.setenv("DATABASE_DSN", pg_dsn)
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=10)
    try:
        # The pages speak of a fleet whose ledger knows the job "nightly-reindex" (its
        # fleet-wide pause refuses a name no replica ever noted or ran): one run of it,
        # as README.md's locked_run snippet makes, whichever page runs first.
        await run_locked(pool, "nightly-reindex", _nothing, slot=_ONCE)
        await run_chain(snippet, {"dsn": pg_dsn, "pool": pool})
    finally:
        async with asyncio.timeout(10):
            await pool.close()
