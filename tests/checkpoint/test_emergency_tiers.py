"""An emergency checkpoint through a tiered manager lands on every tier, whatever the cadence."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from resiliency.checkpoint import (
    AppState,
    CheckpointManager,
    EmergencyCheckpoint,
    LocalTier,
    PersistentTier,
)


def test_emergency_step_is_saved_on_every_tier(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    state = {"app": AppState(model, opt)}
    manager = CheckpointManager(
        None,
        tiers=[
            LocalTier(tmp_path / "local", every=10, replicas=0),
            PersistentTier(tmp_path / "persistent", every=100),
        ],
    )
    codes: list[int] = []
    ec = EmergencyCheckpoint(manager, lead=2, exit_fn=codes.append)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        stop = next(step for step in range(1, 50) if ec.should_stop(step))
        assert stop % 10 != 0, "pick a step that no tier's cadence divides"
        with pytest.raises(SystemExit) as exited:
            ec.save_and_exit(stop, state)
        assert exited.value.code == 0 and codes == [0]
        assert (tmp_path / "local" / f"step_{stop:09d}").is_dir()
        assert (tmp_path / "persistent" / f"step_{stop:09d}").is_dir()
    finally:
        ec.close()
        manager.close()
