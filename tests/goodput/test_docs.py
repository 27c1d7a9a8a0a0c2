"""docs/goodput.md: its schema reference is the one the code generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from resiliency.goodput.schema import REFERENCE_BEGIN, update_schema_reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "goodput.md"


def test_schema_reference_is_up_to_date() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert REFERENCE_BEGIN in text
    assert text == update_schema_reference(text), (
        "docs/goodput.md's schema reference is stale; regenerate it with "
        "`python -m resiliency.goodput._reference docs/goodput.md`"
    )


def test_update_needs_the_markers() -> None:
    with pytest.raises(ValueError, match="no schema reference markers"):
        update_schema_reference("# a page\n")
