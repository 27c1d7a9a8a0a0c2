"""Each package uses only what a sibling exports in its ``__all__`` (its versioned interface)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "packages"

# package source folder -> the siblings it may use
INTERFACES = {
    "ft-launcher/src/resiliency/launcher": (
        "resiliency.ft",
        "resiliency.goodput",
        "resiliency.supervisor",
    ),
    "ptl-resiliency/src/resiliency/ptl": (
        "resiliency.checkpoint",
        "resiliency.ft",
        "resiliency.goodput",
        "resiliency.straggler",
    ),
    "straggler-cupti/src/resiliency/straggler_cupti": ("resiliency.straggler",),
    "supervisor/src/resiliency/supervisor": ("resiliency.goodput",),
}
ALL_MODULES = (
    "resiliency.checkpoint",
    "resiliency.ft",
    "resiliency.goodput",
    "resiliency.launcher",
    "resiliency.ptl",
    "resiliency.straggler",
    "resiliency.straggler_cupti",
    "resiliency.supervisor",
)


def _sibling_imports(folder: Path, own: str) -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules: list[tuple[str, list[str]]] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.append((node.module, [alias.name for alias in node.names]))
            elif isinstance(node, ast.Import):
                modules.extend((alias.name, []) for alias in node.names)
            for module, names in modules:
                root = next(
                    (m for m in ALL_MODULES if module == m or module.startswith(m + ".")), None
                )
                if root is None or root == own:
                    continue
                assert module == root, f"{path.name} imports {module}, a private part of {root}"
                used.setdefault(root, set()).update(names)
    return used


@pytest.mark.parametrize("folder", sorted(INTERFACES))
def test_only_public_sibling_names_are_used(folder: str) -> None:
    own = "resiliency." + folder.rsplit("/", 1)[1]
    used = _sibling_imports(PACKAGES / folder, own)
    allowed = INTERFACES[folder]
    assert set(used) <= set(allowed), f"{own} uses {sorted(set(used) - set(allowed))}"
    for module, names in used.items():
        exported = set(importlib.import_module(module).__all__)
        assert set(names) <= exported, f"{module} does not export {sorted(set(names) - exported)}"


@pytest.mark.parametrize(
    "module",
    [
        "resiliency.ft",
        "resiliency.goodput",
        "resiliency.straggler",
        "resiliency.launcher",
        "resiliency.supervisor",
    ],
)
def test_every_exported_name_exists(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert getattr(mod, name, None) is not None, f"{module}.__all__ names missing {name!r}"
