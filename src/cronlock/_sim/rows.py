"""What the simulated server answers: rows that read like asyncpg's ``Record``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ("Row", "rows")


class Row:
    """One answered row: by position (``row[0]``) or by column name (``row["job"]``),
    iterable over its values, ``dict(row)``-able, as asyncpg's ``Record`` is."""

    __slots__ = ("_index", "_values")

    def __init__(self, names: Sequence[str], values: Sequence[Any]) -> None:
        if len(names) != len(values):
            raise ValueError(f"{len(names)} columns, {len(values)} values")
        self._index = {name: i for i, name in enumerate(names)}
        self._values = tuple(values)

    def __getitem__(self, key: int | str | slice) -> Any:
        if isinstance(key, str):
            return self._values[self._index[key]]
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of column *key*, or *default* when there is no such column."""
        i = self._index.get(key)
        return default if i is None else self._values[i]

    def keys(self) -> Iterator[str]:
        """The column names, in order."""
        return iter(self._index)

    def values(self) -> Iterator[Any]:
        """The values, in order."""
        return iter(self._values)

    def items(self) -> Iterator[tuple[str, Any]]:
        """(name, value) pairs, in order."""
        return zip(self._index, self._values, strict=True)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        inner = " ".join(f"{k}={v!r}" for k, v in self.items())
        return f"<Row {inner}>"


def rows(names: Sequence[str], *records: Sequence[Any]) -> list[Row]:
    """Rows of the columns *names*, one per sequence of values (they share one index of
    the names, built once: a row never changes its index, and every answer is rows)."""
    width = len(names)
    index = {name: i for i, name in enumerate(names)}
    answer = []
    for values in records:
        if len(values) != width:
            raise ValueError(f"{width} columns, {len(values)} values")
        row = Row.__new__(Row)
        row._index = index
        row._values = tuple(values)
        answer.append(row)
    return answer
