"""An MkDocs hook: the build fails when a public name is missing from the Reference.

Every name in ``cronlock.__all__``, ``cronlock.postgres.__all__`` and
``cronlock.testing.__all__`` must have a docstring in the source and a section of its own
(an element whose ``id`` is its dotted path) on the generated reference page of its module.
griffe reads the source without importing it, as mkdocstrings does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe
from mkdocs.exceptions import PluginError

# module -> the reference page that documents it (relative to the site directory)
PAGES = {
    "cronlock": "reference/cronlock.html",
    "cronlock.postgres": "reference/postgres.html",
    "cronlock.testing": "reference/testing.html",
    "cronlock.prometheus": "reference/prometheus.html",
    "cronlock.otel": "reference/otel.html",
    "cronlock.web": "reference/web.html",
    "cronlock.celery": "reference/celery.html",
}


def public_names(module: griffe.Module) -> list[str]:
    """The names the module lists in ``__all__`` (griffe evaluates the tuple statically)."""
    exports = module.exports
    if not exports:
        raise PluginError(f"{module.path} has no __all__ griffe can read")
    return sorted(str(name) for name in exports)


def problems(src: Path, site: Path) -> list[str]:
    """What is wrong with the reference, one line per public name."""
    package = griffe.load("cronlock", search_paths=[str(src)], resolve_aliases=True)
    found: list[str] = []
    for module_path, page in PAGES.items():
        module = package if module_path == "cronlock" else package[module_path.split(".", 1)[1]]
        html = (site / page).read_text(encoding="utf-8")
        ids = set(re.findall(r'id="([^"]+)"', html))
        for name in public_names(module):
            obj = module[name]
            target = obj.final_target if isinstance(obj, griffe.Alias) else obj
            if not (target.docstring and target.docstring.value.strip()):
                found.append(f"{module_path}.{name} ({target.path}) has no docstring")
            if f"{module_path}.{name}" not in ids:
                found.append(f"{module_path}.{name} is not documented on {page}")
    return found


def on_post_build(config: Any, **kwargs: Any) -> None:
    """Fail the build (strict or not) when a public name is undocumented."""
    root = Path(config["config_file_path"]).parent
    found = problems(root / "src", Path(config["site_dir"]))
    if found:
        raise PluginError("undocumented public names:\n  " + "\n  ".join(found))
