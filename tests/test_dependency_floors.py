"""The extras' lower bounds stay past the releases with known security fixes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# (extra, package, first fixed release, advisory)
FIXED = [
    # O(n^2) merging of a Range header's ranges in FileResponse, which serves the
    # dashboard's /static files: one unauthenticated request pegs a core.
    ("web", "starlette", "0.49.1", "CVE-2025-62727"),
    # Sandbox escapes (and the xmlattr and compiler fixes before them); the dashboard uses
    # no sandbox and ships its templates, but scanners flag the range all the same.
    ("web", "jinja2", "3.1.6", "CVE-2025-27516"),
    # Malformed chunked bodies accepted (request smuggling behind a lenient proxy): the
    # HTTP parser of uvicorn's default protocol, which 'python -m cronlock web' serves on.
    ("web", "h11", "0.16", "CVE-2025-43859"),
]


@pytest.mark.parametrize(("extra", "package", "fixed", "advisory"), FIXED)
def test_no_version_the_extra_allows_predates_the_fix(
    extra: str, package: str, fixed: str, advisory: str
) -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    [requirement] = [
        r for r in map(Requirement, extras[extra]) if r.name.lower() == package.lower()
    ]
    floors = [Version(s.version) for s in requirement.specifier if s.operator in (">=", ">")]
    assert floors, f"{extra}: {requirement} has no lower bound ({advisory})"
    assert max(floors) >= Version(fixed), f"{extra}: {requirement} allows {advisory}"
