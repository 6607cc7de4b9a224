"""What the command line escapes in the ledger's text before a terminal sees it."""

from __future__ import annotations

import pytest

from cronlock._terminal import printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # clear the screen
        ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),  # write the clipboard
        ("ok\rfake", "ok\\rfake"),
        ("a\nb\tc\x00", "a\\nb\\tc\\x00"),
        ("\x7f\x85\x9b", "\\x7f\\x85\\x9b"),  # DEL, NEL, the one-byte CSI
        ("abc\u202edef", "abc\\u202edef"),  # right-to-left override
        ("\u202a\u2066\u2069", "\\u202a\\u2066\\u2069"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("café ☕ 日本 \u00a0", "café ☕ 日本 \u00a0"),  # text stays text
        ("C:\\path", "C:\\path"),
    ],
)
def test_what_a_terminal_would_act_on_is_escaped(raw: str, shown: str) -> None:
    assert printable(raw) == shown
