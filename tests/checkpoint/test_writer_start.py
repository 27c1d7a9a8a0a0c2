"""Saves while the writer process starts (local and persistent tiers): the rank writes the save
itself, off the training thread, so the next save never waits seconds for the writer's imports."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from resiliency.checkpoint import CheckpointManager, LocalTier, PersistentTier

pytestmark = pytest.mark.timeout(180)


def _state(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.arange(1024, dtype=torch.float32) * step, "b": torch.full((8,), step)}


def _assert_each_step_loads_exactly(mgr: CheckpointManager, steps: tuple[int, ...]) -> None:
    for step in steps:
        target = {"w": torch.zeros(1024), "b": torch.zeros(8, dtype=torch.int64)}
        assert mgr.load(target, step=step) == step
        assert torch.equal(target["w"], _state(step)["w"])
        assert torch.equal(target["b"], _state(step)["b"])


def test_saves_before_the_writer_is_ready_are_written_by_the_rank(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="resiliency.checkpoint")
    mgr = CheckpointManager(None, tiers=[LocalTier(tmp_path / "local", every=1, replicas=0)])
    try:
        # Straight after construction: the writer is still importing torch (seconds).
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
        mgr.wait()
        by_rank = [r for r in caplog.records if "by the rank itself" in r.getMessage()]
        assert by_rank, "no save was written in-process while the writer started"
        writer = mgr._tiered.local._writer
        writer.wait_ready(writer.deadline(120))
        caplog.clear()
        mgr.save(4, _state(4))
        mgr.wait()
        assert not [r for r in caplog.records if "by the rank itself" in r.getMessage()]
        assert mgr.steps()[-1] == 4
        _assert_each_step_loads_exactly(mgr, (3, 4))
    finally:
        mgr.close()


@pytest.mark.parametrize("tiered", [False, True], ids=["single-tier", "persistent-tier"])
def test_persistent_saves_before_the_writer_is_ready_are_written_by_the_rank(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tiered: bool
) -> None:
    caplog.set_level(logging.INFO, logger="resiliency.checkpoint")
    if tiered:
        tiers = [LocalTier(tmp_path / "local", every=100, replicas=0)]
        mgr = CheckpointManager(None, tiers=[*tiers, PersistentTier(tmp_path / "ckpt", every=1)])
    else:
        mgr = CheckpointManager(tmp_path / "ckpt")
    try:
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
        mgr.wait()
        assert [r for r in caplog.records if "by the rank itself" in r.getMessage()]
        single = mgr._tiered.persistent if tiered else mgr
        writer = single._writer
        writer.wait_ready(writer.deadline(120))
        caplog.clear()
        mgr.save(4, _state(4))
        mgr.wait()
        assert not [r for r in caplog.records if "by the rank itself" in r.getMessage()]
        assert mgr.steps() == [2, 3, 4]  # keep_last=3
        _assert_each_step_loads_exactly(mgr, (2, 3, 4))
    finally:
        mgr.close()
