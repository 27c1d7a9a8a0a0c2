"""The local tier plans a shard once and reuses the plan while the state keeps its structure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from resiliency.checkpoint import CheckpointManager, LocalTier

pytestmark = pytest.mark.timeout(180)


def test_a_changed_structure_is_planned_again_on_the_local_tier(tmp_path: Path) -> None:
    mgr = CheckpointManager(
        None, tiers=[LocalTier(tmp_path / "local", every=1, replicas=0, keep_last=4)]
    )
    try:
        cache = mgr._tiered.local._plan_cache
        mgr.save(1, {"w": torch.ones(4)})
        mgr.save(2, {"w": torch.full((4,), 2.0)})
        mgr.wait()
        assert cache.version == 1  # step 2 reused step 1's plan
        mgr.save(3, {"w": torch.full((4,), 3.0), "b": torch.arange(3)})  # a new entry
        mgr.save(4, {"w": torch.full((8,), 4.0), "b": torch.arange(3)})  # a new shape
        mgr.wait()
        assert cache.version == 3
        for step, state in (
            (2, {"w": torch.zeros(4)}),
            (3, {"w": torch.zeros(4), "b": torch.zeros(3, dtype=torch.int64)}),
            (4, {"w": torch.zeros(8), "b": torch.zeros(3, dtype=torch.int64)}),
        ):
            assert mgr.load(state, step=step) == step
            assert torch.equal(state["w"], torch.full_like(state["w"], float(step)))
            if "b" in state:
                assert torch.equal(state["b"], torch.arange(3))
    finally:
        mgr.close()
