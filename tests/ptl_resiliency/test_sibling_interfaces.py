"""resiliency.ptl uses only what its siblings export in ``__all__`` (a versioned interface)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import resiliency.ptl

PTL_DIR = Path(resiliency.ptl.__file__).parent
SIBLINGS = ("resiliency.ft", "resiliency.straggler")


def _imports_from_siblings() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {name: set() for name in SIBLINGS}
    for path in PTL_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not any(node.module.startswith(s + ".") for s in SIBLINGS), (
                    f"{path.name} imports the private module {node.module}"
                )
                if node.module in used:
                    used[node.module].update(alias.name for alias in node.names)
    return used


def test_only_public_sibling_names_are_used() -> None:
    used = _imports_from_siblings()
    assert used["resiliency.ft"] and used["resiliency.straggler"]
    for module, names in used.items():
        exported = set(importlib.import_module(module).__all__)
        assert names <= exported, f"{module} does not export {sorted(names - exported)}"


def test_own_all_is_importable() -> None:
    for name in resiliency.ptl.__all__:
        assert hasattr(resiliency.ptl, name), name
