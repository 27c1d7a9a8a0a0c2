"""Print the README's commands that CI runs, one per line: the bash block after `<!-- test: ci -->`.

`.ci/run` runs each line exactly as written, so a README command that fails turns CI red.
tests/docs/test_doc_examples.py checks that the README has exactly one such block.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MARKER = re.compile(r"^\s*<!--\s*test:\s*ci\b.*-->\s*$")


def readme_commands(readme: Path) -> list[str]:
    """Return the non-empty lines of every bash block marked `ci`, in order."""
    lines = readme.read_text().splitlines()
    commands: list[str] = []
    i = 0
    while i < len(lines):
        if MARKER.match(lines[i]) and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            i += 2
            while i < len(lines) and not lines[i].startswith("```"):
                if lines[i].strip():
                    commands.append(lines[i].strip())
                i += 1
        i += 1
    return commands


if __name__ == "__main__":
    found = readme_commands(Path(sys.argv[1] if len(sys.argv) > 1 else "README.md"))
    if not found:
        sys.exit("no `<!-- test: ci -->` block in the README: CI has nothing to run")
    print("\n".join(found))
