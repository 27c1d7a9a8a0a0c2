"""No helper of the launcher imports the agent (issue 26): they get what they need from it.

Read as source; type-only imports count too, since a helper that names the agent's type is
handed the agent.
"""

from __future__ import annotations

import ast
from pathlib import Path

import resiliency.launcher

PACKAGE = Path(resiliency.launcher.__file__).parent
# The facade re-exports the agent; launch builds it and runs it.
ALLOWED = {"__init__.py", "agent.py", "_launch.py"}


def _imports_the_agent(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = {alias.name for alias in node.names}
            if module == "resiliency.launcher.agent" or (node.level and module == "agent"):
                return True
            if module == "resiliency.launcher" and "agent" in names:
                return True
        elif isinstance(node, ast.Import) and any(
            alias.name == "resiliency.launcher.agent" for alias in node.names
        ):
            return True
    return False


def test_only_the_facade_and_launch_import_the_agent() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 20, f"the launcher's modules were not found in {PACKAGE}"
    offenders = [p.name for p in modules if p.name not in ALLOWED and _imports_the_agent(p)]
    assert not offenders, f"launcher helpers that import the agent: {offenders}"


def test_the_check_sees_a_type_only_import(tmp_path: Path) -> None:
    helper = tmp_path / "helper.py"
    helper.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from resiliency.launcher.agent import FtElasticAgent\n"
    )
    assert _imports_the_agent(helper)
    helper.write_text("def f():\n    from .agent import _NodeLeaves\n")
    assert _imports_the_agent(helper)
    helper.write_text("from resiliency.launcher._agent_settings import Outcome\n")
    assert not _imports_the_agent(helper)
