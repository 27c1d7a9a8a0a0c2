"""Each package uses only what a sibling exports in its ``__all__`` (its versioned interface)."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest
import tomllib

PACKAGES = Path(__file__).resolve().parents[2] / "packages"

# package source folder -> the siblings it may use
INTERFACES = {
    "checkpoint/src/resiliency/checkpoint": ("resiliency.goodput",),
    "ft-core/src/resiliency/ft": (),
    "goodput/src/resiliency/goodput": (),
    # works under plain torchrun: never the launcher (its session installs ft-launcher for tests);
    # ft-core for the GPU probe of its health checks
    "inprocess/src/resiliency/inprocess": ("resiliency.ft", "resiliency.goodput"),
    "simulator/src/resiliency/simulator": ("resiliency.goodput",),
    "straggler/src/resiliency/straggler": (),
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
    "supervisor/src/resiliency/supervisor": ("resiliency.ft", "resiliency.goodput"),
}
ALL_MODULES = (
    "resiliency.checkpoint",
    "resiliency.ft",
    "resiliency.goodput",
    "resiliency.inprocess",
    "resiliency.launcher",
    "resiliency.ptl",
    "resiliency.simulator",
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
        "resiliency.checkpoint",
        "resiliency.ft",
        "resiliency.goodput",
        "resiliency.inprocess",
        "resiliency.straggler",
        "resiliency.launcher",
        "resiliency.ptl",
        "resiliency.simulator",
        "resiliency.supervisor",
    ],
)
def test_every_exported_name_exists(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert getattr(mod, name, None) is not None, f"{module}.__all__ names missing {name!r}"


# Import name -> the distribution that provides it.
DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "pynvml": "nvidia-ml-py",
    "prometheus_client": "prometheus-client",
}
# Imported lazily, inside a guard, for a feature that is optional and not worth an extra.
OPTIONAL_UNDECLARED = {
    "ft-core": {"torch"},  # the cross-rank timeout all-reduce, only when torch.distributed is up
    # cross-rank exchange and CUDA events (pip install resiliency-straggler alone works)
    "straggler": {"torch"},
    "ptl-resiliency": {"pytorch_lightning"},  # the second import path of Lightning
}


def _declared(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    return {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower() for spec in specs}


@pytest.mark.parametrize("package", sorted(p.name for p in PACKAGES.iterdir() if p.is_dir()))
def test_every_third_party_import_is_declared(package: str) -> None:
    folder = PACKAGES / package
    declared = _declared(folder / "pyproject.toml")
    imported: set[str] = set()
    for path in (folder / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "resiliency"}
    missing = {
        m
        for m in third_party - OPTIONAL_UNDECLARED.get(package, set())
        if DISTRIBUTIONS.get(m, m).replace("_", "-") not in declared
    }
    assert not missing, (
        f"{package} imports {sorted(missing)} but its pyproject.toml does not declare them"
    )
