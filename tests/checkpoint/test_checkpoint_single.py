"""One process, no process group: the manager, AppState and the on-disk format."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from resiliency.checkpoint import (
    AppState,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointManager,
    NoCheckpointError,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def manager(tmp_path: Path):
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=2, keep_every=10)
    yield mgr
    mgr.close()
    assert mgr.writer_pid is None


def _app(seed: int) -> AppState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return AppState(model, opt, epoch=seed)


def test_save_load_steps_latest_and_retention(manager: CheckpointManager):
    assert manager.latest() is None and manager.steps() == []
    assert manager.load({"app": _app(0)}) is None
    app = _app(1)
    for step in (5, 10, 15, 20, 25):
        manager.save(step, {"app": app, "tensor": torch.arange(4) * step})
    manager.wait()
    assert manager.steps() == [10, 20, 25] and manager.latest() == 25
    fresh = _app(2)
    target = {"app": fresh, "tensor": torch.zeros(4, dtype=torch.int64)}
    assert manager.load(target) == 25
    assert torch.equal(target["tensor"], torch.arange(4) * 25)
    assert torch.equal(fresh.model.weight, app.model.weight)
    assert fresh.extra["epoch"] == 1
    assert manager.load({"app": _app(3)}, step=10) == 10
    with pytest.raises(NoCheckpointError):
        manager.load({"app": _app(3)}, step=7)


# torch's dcp.load, called here as a user of plain DCP would, warns that it loads in one process.
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_committed_step_is_a_standard_dcp_checkpoint(manager: CheckpointManager, tmp_path: Path):
    app = _app(4)
    writer = manager._writer
    writer.wait_ready(writer.deadline(120))  # the writer process writes it, not the rank
    manager.save(3, {"app": app}).wait()
    step_dir = tmp_path / "ckpt" / "step_000000003"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp"}
    assert manifest["step"] == 3 and manifest["world_size"] == 1
    plain = _app(5)
    dcp.load({"app": plain}, checkpoint_id=str(step_dir))
    assert torch.equal(plain.model.weight, app.model.weight)
    dcp_to_torch_save(step_dir, tmp_path / "full.pt")
    full = torch.load(tmp_path / "full.pt", weights_only=False)
    assert torch.equal(full["app"]["model"]["weight"], app.model.weight)


def test_resaving_a_committed_step_is_a_no_op(manager: CheckpointManager, tmp_path: Path):
    manager.save(1, {"x": torch.ones(2)}).wait()
    before = (tmp_path / "ckpt" / "step_000000001" / "manifest.json").read_bytes()
    handle = manager.save(1, {"x": torch.zeros(2)})
    assert handle.done()
    handle.wait()
    assert (tmp_path / "ckpt" / "step_000000001" / "manifest.json").read_bytes() == before
    target = {"x": torch.full((2,), 7.0)}
    manager.load(target)
    assert torch.equal(target["x"], torch.ones(2))


def test_staging_is_a_snapshot_and_is_reused(manager: CheckpointManager):
    x = torch.zeros(1 << 16)
    for step in range(1, 4):
        x.fill_(step)
        handle = manager.save(step, {"x": x})
        x.fill_(-1)  # the training loop changes it at once; the save keeps the staged copy
        handle.wait()
    arena = manager._arena
    assert arena.generation == 1  # allocated once, reused by every save
    target = {"x": torch.empty(1 << 16)}
    assert manager.load(target) == 3
    assert bool((target["x"] == 3).all())


def test_corrupt_newest_step_falls_back_with_a_warning(
    manager: CheckpointManager, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    for step in (1, 2):
        manager.save(step, {"x": torch.full((64,), float(step))}).wait()
    shard = tmp_path / "ckpt" / "step_000000002" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    target = {"x": torch.zeros(64)}
    with caplog.at_level(logging.WARNING, logger="resiliency.checkpoint"):
        assert manager.load(target) == 1
    assert "step_000000002/__0_0.distcp: crc32" in caplog.text
    assert bool((target["x"] == 1).all())
    with pytest.raises(CheckpointCorruptError):
        manager.load(target, step=2)
    os.unlink(tmp_path / "ckpt" / "step_000000001" / "manifest.json")
    with pytest.raises(CheckpointCorruptError):
        manager.load(target)


def test_sync_mode_and_closed_manager(tmp_path: Path):
    mgr = CheckpointManager(tmp_path / "sync", async_save=False, keep_last=None)
    handle = mgr.save(1, {"x": torch.ones(3)})
    assert handle.done() and mgr.latest() == 1
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(CheckpointError, match="closed"):
        mgr.save(2, {"x": torch.ones(3)})


def test_stale_temporary_directories_are_removed_at_start(tmp_path: Path):
    root = tmp_path / "ckpt"
    (root / ".tmp-step_7-dead").mkdir(parents=True)
    (root / ".tmp-step_7-dead" / "__0_0.distcp").write_bytes(b"torn")
    mgr = CheckpointManager(root)
    try:
        assert not (root / ".tmp-step_7-dead").exists()
        assert mgr.steps() == []
    finally:
        mgr.close()


def test_invalid_arguments_are_rejected(tmp_path: Path):
    for kwargs in ({"keep_last": 0}, {"keep_every": 0}, {"writer_timeout_s": 0}):
        with pytest.raises(ValueError):
            CheckpointManager(tmp_path, **kwargs)


def test_a_changed_structure_is_planned_again(manager: CheckpointManager):
    manager.save(1, {"x": torch.ones(4), "lr": 0.1}).wait()
    version = manager._plan_cache.version
    manager.save(2, {"x": torch.full((4,), 2.0), "lr": 0.2}).wait()  # same structure: reused
    assert manager._plan_cache.version == version
    manager.save(3, {"x": torch.full((8,), 3.0), "lr": 0.3}).wait()  # new shape: new plan
    assert manager._plan_cache.version == version + 1
    target = {"x": torch.zeros(8), "lr": 0.0}
    assert manager.load(target) == 3
    assert bool((target["x"] == 3).all()) and target["lr"] == 0.3


def test_a_lazy_writer_starts_at_the_first_save(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt", eager_writer=False)
    try:
        assert mgr.writer_pid is None  # nothing imports torch beside the job at start-up
        app = _app(3)
        mgr.save(1, {"app": app})
        mgr.wait()
        assert mgr.writer_pid is not None and os.path.exists(f"/proc/{mgr.writer_pid}")
        assert mgr.steps() == [1]
        fresh = _app(4)
        assert mgr.load({"app": fresh}) == 1
        assert torch.equal(fresh.model.weight, app.model.weight)
    finally:
        mgr.close()
    assert mgr.writer_pid is None
