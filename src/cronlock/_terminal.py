"""Text from the ledger, made safe to print on an operator's terminal.

Job names, errors, hosts, schedules and application names come from the ledger and
``pg_stat_activity``, which any replica (or any client that may write those tables or
set its ``application_name``) fills in. Printed raw, an escape sequence in them would act
on the terminal: clear the screen (``ESC [2J``), write the clipboard (OSC 52), move the
cursor, or fake a line with ``\\r``; a bidi override (U+202E) would reorder what follows.
So every such character is shown as its Python escape instead (``\\x1b``, ``\\r``,
``\\u202e``): C0 controls, DEL, C1 controls, the bidi embeddings, overrides and isolates,
and the Unicode line and paragraph separators. The JSON a command prints needs none of
this: ``json.dumps`` escapes controls already (and ``ensure_ascii`` the rest).
"""

from __future__ import annotations

__all__ = ("printable",)

_CODES = [
    *range(0x20),  # C0, tab and newline included: one row stays one line
    *range(0x7F, 0xA0),  # DEL and C1 (0x9B is a one-byte CSI)
    *range(0x202A, 0x202F),  # bidi embeddings and overrides
    *range(0x2066, 0x206A),  # bidi isolates
    0x2028,  # line separator
    0x2029,  # paragraph separator
]
_ESCAPES = {code: repr(chr(code))[1:-1] for code in _CODES}


def printable(text: str) -> str:
    """*text* with every character a terminal would act on written as its escape."""
    return text.translate(_ESCAPES)
