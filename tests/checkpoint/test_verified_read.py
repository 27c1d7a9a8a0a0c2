"""The one-pass verified load of a local shard: same result as DCP's load, corruption caught."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from resiliency.checkpoint import CheckpointManager, LocalTier
from resiliency.checkpoint._read.verified import CorruptShardError, load_verified
from resiliency.checkpoint._tiers.holdings import shard_dir

# torch's own dcp.load (the reference these tests compare with) warns that it loads in one process
# even when told so with no_dist=True; the toolkit's load silences exactly that warning itself.
DCP_SINGLE_PROCESS = "ignore:torch.distributed is disabled:UserWarning"


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def _state(seed: int) -> dict[str, Any]:
    model, opt = _model_and_optimizer(seed)
    g = torch.Generator().manual_seed(seed)
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "transposed": torch.randn(5, 7, generator=g).t(),
        "bf16": torch.randn(33, generator=g).to(torch.bfloat16),
        "ints": torch.arange(10) * seed,
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(float(seed)),
        "step": seed,
        "meta": {"name": f"run-{seed}", "lr": 0.1 * seed},
    }


def _target() -> dict[str, Any]:
    """A state of the same structure and different values, as a restarted job has."""
    state = _state(99)
    state["transposed"] = torch.zeros(7, 5)
    return state


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module", params=["by-the-rank", "by-the-writer"])
def saved(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A shard written by the rank itself (its writer still starting), or by its writer process
    (which leaves the zip records' own CRC-32s out)."""
    root = tmp_path_factory.mktemp("local")
    mgr = CheckpointManager(None, tiers=[LocalTier(root, replicas=0)])
    try:
        if request.param == "by-the-writer":
            writer = mgr._tiered.local._writer
            writer.wait_ready(writer.deadline(120))
        mgr.save(3, _state(3), tier="local").wait()
    finally:
        mgr.close()
    return shard_dir(root, 3, 0)


@pytest.fixture
def shard(saved: Path, tmp_path: Path) -> Path:
    """A copy of one saved shard, for this test to damage."""
    return Path(shutil.copytree(saved, tmp_path / "shard"))


def _data_file(shard: Path) -> Path:
    (path,) = shard.glob("*.distcp")
    return path


@pytest.mark.filterwarnings(DCP_SINGLE_PROCESS)
def test_loads_the_same_state_as_dcp_and_reads_tensors_in_place(shard: Path) -> None:
    expected, got = _target(), _target()
    dcp.load(expected, checkpoint_id=shard, no_dist=True)
    direct = load_verified(got, shard)
    assert _equal(expected, got)
    assert _equal(got["model"], _state(3)["model"])
    assert torch.equal(got["transposed"], _state(3)["transposed"])
    assert got["step"] == 3 and got["meta"] == {"name": "run-3", "lr": 0.1 * 3}
    # The model, optimizer moments and plain tensors all went straight into their targets.
    assert direct >= sum(t.numel() * t.element_size() for t in got["model"].values())


@pytest.mark.filterwarnings(DCP_SINGLE_PROCESS)
def test_a_target_of_another_dtype_takes_dcps_path_and_converts(shard: Path) -> None:
    expected, got = _target(), _target()
    for state in (expected, got):
        state["ints"] = torch.zeros(10, dtype=torch.float64)
    dcp.load(expected, checkpoint_id=shard, no_dist=True)
    load_verified(got, shard)
    assert got["ints"].dtype == torch.float64
    assert torch.equal(got["ints"], torch.arange(10, dtype=torch.float64) * 3)
    assert _equal(expected, got)


@pytest.mark.parametrize("where", ["tensor bytes", "zip header", "last byte"])
def test_a_flipped_byte_anywhere_in_a_data_file_is_caught(shard: Path, where: str) -> None:
    path = _data_file(shard)
    raw = bytearray(path.read_bytes())
    offset = {
        "tensor bytes": raw.find(_state(3)["model"]["0.weight"].numpy().tobytes()[:64]) + 10,
        "zip header": 0,
        "last byte": len(raw) - 1,
    }[where]
    assert offset >= 0
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match=rf"{path.name}.*crc32.*corrupt"):
        load_verified(_target(), shard)


def test_a_torn_data_file_is_caught_before_anything_is_read(shard: Path) -> None:
    path = _data_file(shard)
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    target = _target()
    before = target["model"]["0.weight"].clone()
    with pytest.raises(CorruptShardError, match="torn"):
        load_verified(target, shard)
    assert torch.equal(target["model"]["0.weight"], before)


def test_corrupt_metadata_is_caught_before_dcp_unpickles_it(shard: Path) -> None:
    meta = shard / ".metadata"
    raw = bytearray(meta.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    meta.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match=r"\.metadata.*corrupt"):
        load_verified(_target(), shard)


def test_a_missing_manifest_or_file_is_a_corrupt_shard(shard: Path) -> None:
    _data_file(shard).unlink()
    with pytest.raises(CorruptShardError, match="distcp"):
        load_verified(_target(), shard)
    (shard / "manifest.json").unlink()
    with pytest.raises(CorruptShardError, match=r"manifest\.json"):
        load_verified(_target(), shard)


def test_a_state_that_does_not_match_is_dcps_error_not_corruption(shard: Path) -> None:
    target = _target()
    target["not_saved"] = torch.zeros(3)
    with pytest.raises(CheckpointException) as info:
        load_verified(target, shard)
    assert "not_saved" in str(info.value)
