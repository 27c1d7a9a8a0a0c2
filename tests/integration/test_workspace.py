"""The uv workspace that lets every package find its siblings in this checkout by itself.

A package that gains a sibling dependency must name that sibling `{ workspace = true }` in its
own ``[tool.uv.sources]``; without it, ``uv pip install ./packages/<name>`` (and the nox session
of every package above it) looks for the sibling in the package index and fails. This test says
so before any install does, and checks that what users get from an index (the version ranges) is
untouched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECTS = sorted(REPO.glob("packages/*/pyproject.toml"))


def _load(path: Path) -> dict:
    return tomllib.loads(path.read_text())


SIBLINGS = {_load(p)["project"]["name"]: p for p in PYPROJECTS}


def _requirements(project: dict) -> list[Requirement]:
    reqs = [Requirement(r) for r in project.get("dependencies", [])]
    for extra in project.get("optional-dependencies", {}).values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def test_every_package_is_a_member_of_the_root_workspace():
    members = _load(REPO / "pyproject.toml")["tool"]["uv"]["workspace"]["members"]
    covered = {p for pattern in members for p in REPO.glob(f"{pattern}/pyproject.toml")}
    assert covered == set(PYPROJECTS), "packages outside [tool.uv.workspace] members"


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: p.parent.name)
def test_sibling_requirements_come_from_the_workspace_and_keep_their_ranges(pyproject):
    data = _load(pyproject)
    sources = data.get("tool", {}).get("uv", {}).get("sources", {})
    needed = set()
    for req in _requirements(data["project"]):
        if req.name not in SIBLINGS:
            continue
        needed.add(req.name)
        assert req.url is None and str(req.specifier), (
            f"{pyproject}: {req} must be a version range (what users get from an index), "
            "not a path or an unbounded name"
        )
        version = Version(_load(SIBLINGS[req.name])["project"]["version"])
        assert req.specifier.contains(version), (
            f"{pyproject}: {req} does not admit {req.name} {version}, the version in this checkout"
        )
    for name in needed:
        assert sources.get(name) == {"workspace": True}, (
            f"{pyproject}: add `{name} = {{ workspace = true }}` under [tool.uv.sources], or uv "
            f"looks for {name} in the package index and the install fails"
        )
    stray = {n for n in sources if n in SIBLINGS} - needed
    assert not stray, f"{pyproject}: [tool.uv.sources] names siblings it does not require: {stray}"


def test_install_hints_name_what_an_index_has():
    """An error's `pip install ...` hint must work for the user who reads it.

    None of this repository's distributions is on a package index, so a hint names the
    third-party package itself (`pip install matplotlib`), not `resiliency-x[extra]`.
    """
    hint = re.compile(r"pip install\s+['\"]?(resiliency-[A-Za-z0-9_-]+)")
    bad = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted(REPO.glob("packages/*/src/**/*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if hint.search(line)
    ]
    assert not bad, "hints that cannot be installed from an index:\n" + "\n".join(bad)
