"""``CallWrapper.atomic(progress=False)``: shielded from the abort, not counted as progress."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from resiliency import inprocess


@pytest.fixture
def call_wrapper(monkeypatch: pytest.MonkeyPatch) -> Iterator[inprocess.CallWrapper]:
    """A one-rank CallWrapper on an in-memory store (no process group needed)."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    store = dist.HashStore()
    with inprocess.CallWrapper(inprocess.Wrapper(store_factory=lambda: store)) as wrapper:
        yield wrapper


def test_a_shielded_block_holds_the_abort_lock_and_is_not_progress(
    call_wrapper: inprocess.CallWrapper,
) -> None:
    with call_wrapper.atomic(progress=False):
        assert call_wrapper.atomic_lock._is_owned()  # type: ignore[attr-defined]
    assert call_wrapper._marks == 0
    with call_wrapper.atomic():
        pass
    assert call_wrapper._marks == 1
