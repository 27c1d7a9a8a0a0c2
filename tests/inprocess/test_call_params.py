"""The wrapped function's parameters that receive the current ``CallWrapper``."""

from __future__ import annotations

from typing import Optional

from resiliency.inprocess import CallWrapper
from resiliency.inprocess._call_params import params_annotated


def test_every_spelling_of_the_annotation_is_found_and_nothing_else() -> None:
    def fn(
        a: CallWrapper,
        b: Optional[CallWrapper],  # noqa: UP045 (the spelling NVRx's examples use)
        c: CallWrapper | None = None,
        d: int = 0,
    ) -> CallWrapper:
        raise AssertionError("never called")

    assert params_annotated(fn, CallWrapper) == ["a", "b", "c"]


def test_unresolvable_annotations_fall_back_on_their_text() -> None:
    def fn(call_wrapper: CallWrapper | None = None, other: NoSuchType = None) -> None:  # type: ignore[name-defined] # noqa: F821
        raise AssertionError("never called")

    assert params_annotated(fn, CallWrapper) == ["call_wrapper"]
