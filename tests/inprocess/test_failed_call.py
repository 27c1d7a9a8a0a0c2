"""Freeing a failed call: only what the call created is scanned, and it is all freed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from resiliency.inprocess._failed_call import Fence, release


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen (gc's freeze is process-wide)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def failed_call() -> tuple[BaseException, weakref.ref[Node]]:
    def fn() -> None:
        held = Node()  # noqa: F841 (held by the frame, as a DDP model is)
        raise RuntimeError("injected")

    try:
        fn()
    except RuntimeError as exc:
        frame_locals = exc.__traceback__.tb_next.tb_frame.f_locals  # type: ignore[union-attr]
        return exc, weakref.ref(frame_locals["held"])
    raise AssertionError("fn did not raise")


def test_release_frees_what_the_failed_call_created_and_thaws(unfrozen: None) -> None:
    before = Node()
    fence = Fence()
    fence.close()
    assert gc.get_freeze_count() > 0
    exc, held = failed_call()
    assert held() is not None
    release(exc, fence)
    assert held() is None, "the failed call's cyclic objects survived"
    assert exc.__traceback__ is None
    assert gc.get_freeze_count() == 0, "the objects frozen before the call were not handed back"
    assert before.me is before


def test_someone_elses_freeze_is_left_alone(unfrozen: None) -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    fence = Fence()
    fence.close()
    exc, held = failed_call()
    release(exc, fence)
    assert held() is None
    assert gc.get_freeze_count() >= frozen
