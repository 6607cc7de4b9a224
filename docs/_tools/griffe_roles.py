"""A griffe extension: render the reST bits of cronlock's docstrings as Markdown.

The docstrings are written for readers of the source and for ``help()``: they use Sphinx
roles (``:class:`Clock```, ``:meth:`advance```) and the odd ``.. code-block:: python``.
mkdocstrings renders docstrings as Markdown, where those would show up literally; this
turns a role into inline code and a code-block directive into a fenced block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|exc|mod|data|obj|const):`~?([^`]+)`")
_CODE_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)\.\. code-block:: *(?P<lang>\w+)\n\n"
    r"(?P<body>(?:(?P=indent)[ \t]+.*\n|\n)+)",
    re.M,
)


def _fence(match: re.Match[str]) -> str:
    indent, lang, body = match["indent"], match["lang"], match["body"].rstrip("\n")
    lines = body.split("\n")
    width = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    code = "\n".join(indent + line[width:] if line.strip() else "" for line in lines)
    return f"{indent}```{lang}\n{code}\n{indent}```\n"


def to_markdown(text: str) -> str:
    """The docstring *text* with its Sphinx roles and code-block directives in Markdown."""
    text = _CODE_BLOCK.sub(_fence, text + "\n")
    return _ROLE.sub(lambda m: f"`{m[1]}`", text).rstrip("\n")


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite every loaded object's docstring with :func:`to_markdown`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
