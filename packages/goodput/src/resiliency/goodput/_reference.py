"""``python -m resiliency.goodput._reference [docs/goodput.md]``: regenerate the reference."""

from __future__ import annotations

import sys
from pathlib import Path

from resiliency.goodput.schema import update_schema_reference


def main(argv: list[str] | None = None) -> int:
    """Rewrite the schema reference section of the page (default docs/goodput.md)."""
    args = sys.argv[1:] if argv is None else argv
    page = Path(args[0] if args else "docs/goodput.md")
    page.write_text(update_schema_reference(page.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"schema reference written to {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
