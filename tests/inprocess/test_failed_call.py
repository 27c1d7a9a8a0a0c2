"""Freeing a failed call: only what the call created is scanned, and it is all freed."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from resiliency.inprocess import _failed_call
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
    release(exc, fence, time.monotonic())
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
    release(exc, fence, time.monotonic())
    assert held() is None
    assert gc.get_freeze_count() >= frozen


def test_the_drain_after_the_abort_is_only_what_the_barrier_left_of_it(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(_failed_call.time, "sleep", slept.append)
    fence = Fence()
    for aborted_ago in (10.0, 0.0):  # a barrier that waited for a respawn; one passed at once
        fence.close()
        exc, held = failed_call()
        release(exc, fence, aborted_at=time.monotonic() - aborted_ago)
        assert held() is None
    assert slept[0] == 0.0  # the threads had their time during the barrier
    assert 0.0 < slept[1] <= _failed_call._DRAIN_S
