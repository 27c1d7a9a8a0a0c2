"""CUDA state through the staging arena (GPU only; skipped cleanly without one).

The arena is registered as pinned host memory at the first save of a CUDA tensor, the
device-to-host copies are asynchronous with one synchronization before ``save`` returns, and
the checkpoint holds the values of the moment ``save`` was called even though training changes
the GPU tensors right after. Speed is measured in benchmarks/bench_checkpoint_gpu.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from resiliency.checkpoint import AppState, CheckpointManager

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.timeout(300),
]


def _cuda_app(seed: int) -> AppState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4))).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 1024, device="cuda")).sum().backward()
    opt.step()
    return AppState(model, opt, step=seed)


def test_cuda_state_is_staged_pinned_and_snapshotted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = _cuda_app(1)
    big = torch.rand(64 << 20, device="cuda")  # 256 MiB
    expected_weight = app.model[0].weight.detach().clone()
    expected_big = big.clone()
    with (
        caplog.at_level(logging.WARNING, logger="resiliency.checkpoint"),
        CheckpointManager(tmp_path / "ckpt") as manager,
    ):
        for step in (1, 2):
            handle = manager.save(step, {"app": app, "big": big})
            # training goes on at once, on the same stream: the staged copy must not see it
            big.mul_(2.0)  # exact in binary floating point, and undone exactly
            with torch.no_grad():
                app.model[0].weight.mul_(2.0)
            handle.wait()
            if step == 1:
                assert manager._arena._pinned, "the staging arena was not registered as pinned"
                # the second save starts from the changed values; restore them for the check
                big.div_(2.0)
                with torch.no_grad():
                    app.model[0].weight.div_(2.0)
        arena = manager._arena
        assert arena.generation == 1, "the arena is allocated once and reused"
        fresh = _cuda_app(7)
        target = {"app": fresh, "big": torch.zeros_like(big)}
        assert manager.load(target) == 2
    assert "cudaHostRegister" not in caplog.text
    assert target["big"].is_cuda and torch.equal(target["big"], expected_big)
    assert torch.equal(fresh.model[0].weight, expected_weight)
    assert fresh.extra["step"] == 1
