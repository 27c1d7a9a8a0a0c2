"""Real multi-process checkpoint scenarios: 2-rank DDP over gloo, one process per rank.

Usage: python rank_group.py WORLD OUT DEADLINE_S 0 ckpt_worker.py ROOT SCENARIO OUT
    rank_group.py (torch-free) starts WORLD ranks of this script and waits for them; each rank
    writes ``OUT/rank<r>.json`` (its findings) and logs into ``OUT/rank<r>.log``. Running the
    group under ``unshare`` puts every rank in one mount namespace (the tmpfs disk-full case).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel as DDP

from resiliency.checkpoint import (
    AppState,
    CheckpointCorruptError,
    CheckpointManager,
    SaveFailedError,
    WriterFailedError,
)

try:  # optional: AppState saves NumPy's RNG only when NumPy is installed
    import numpy as np
except ImportError:
    np = None


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


class Trainer:
    """A DDP model, AdamW, and a train step with rank-specific data."""

    def __init__(self, rank: int, seed: int = 0) -> None:
        self.rank = rank
        self.model = DDP(_model(seed))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.app = AppState(self.model, self.opt, sampler={"position": 0})

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            x = torch.randn(16, 32)  # from this rank's torch RNG
            random.random()  # advance the Python (and NumPy) RNGs too
            if np is not None:
                np.random.rand()
            loss = self.model(x).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.app.extra["sampler"] = {"position": self.app.extra["sampler"]["position"] + 16}


def _snapshot(t: Trainer) -> dict[str, Any]:
    return {
        "params": {k: v.detach().clone() for k, v in t.model.module.state_dict().items()},
        "optim": {
            k: {n: (x.clone() if torch.is_tensor(x) else x) for n, x in s.items()}
            for k, s in t.opt.state_dict()["state"].items()
        },
        "torch_rng": torch.get_rng_state(),
        "py_next": random.getstate(),
        "np_state": np.random.get_state() if np is not None else None,
    }


def _equal_to(t: Trainer, snap: dict[str, Any]) -> dict[str, bool]:
    params = t.model.module.state_dict()
    state = t.opt.state_dict()["state"]
    result = {
        "params": all(torch.equal(params[k], v) for k, v in snap["params"].items()),
        "optim": set(state) == set(snap["optim"])
        and all(
            torch.equal(state[k][n], v) if torch.is_tensor(v) else state[k][n] == v
            for k, s in snap["optim"].items()
            for n, v in s.items()
        ),
        "torch_rng": torch.equal(torch.get_rng_state(), snap["torch_rng"]),
        "python_rng": random.getstate() == snap["py_next"],
    }
    if np is not None:
        np_now = np.random.get_state()
        result["numpy_rng"] = bool(np.array_equal(np_now[1], snap["np_state"][1])) and (
            np_now[2] == snap["np_state"][2]
        )
    return result


def _seed_rank(rank: int) -> None:
    torch.manual_seed(1000 + rank)
    random.seed(2000 + rank)
    if np is not None:
        np.random.seed(3000 + rank)


def train_resume(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """Async save while training goes on; fresh model loads bit-identical state (per rank)."""
    _seed_rank(rank)
    t = Trainer(rank)
    t.step(3)
    mgr = CheckpointManager(root, keep_last=2)
    t.step(2)
    snap = _snapshot(t)
    sampler_at_save = dict(t.app.extra["sampler"])
    t0 = time.monotonic()
    handle = mgr.save(5, {"app": t.app})
    blocked = time.monotonic() - t0
    t.step(4)  # training goes on while the writer writes; the staged copy must not change
    handle.wait()
    result: dict[str, Any] = {"blocked_s": blocked, "done": handle.done(), "latest": mgr.latest()}
    _seed_rank(rank + 50)  # scramble the RNGs: load must restore them
    fresh = Trainer(rank, seed=123)
    result["loaded"] = mgr.load({"app": fresh.app})
    result["equal"] = _equal_to(fresh, snap)
    result["sampler"] = fresh.app.extra["sampler"] == sampler_at_save
    result["sampler_value"] = fresh.app.extra["sampler"]
    # Standard DCP: torch's own load reads the committed step without the manager.
    plain = Trainer(rank, seed=77)
    dcp.load({"app": plain.app}, checkpoint_id=str(root / "step_000000005"))
    result["plain_dcp_params"] = _equal_to(plain, snap)["params"]
    result["plain_dcp_optim"] = _equal_to(plain, snap)["optim"]
    mgr.close()
    return result


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def _writer_ready(mgr: CheckpointManager) -> None:
    """Wait until the writer process is up: saves before that are written by the rank itself."""
    writer = mgr._writer
    assert writer is not None
    writer.wait_ready(writer.deadline(120))


def kill_writer(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """SIGKILL rank 0's writer mid-save: every rank gets WriterFailedError; recovery works."""
    t = Trainer(rank)
    mgr = CheckpointManager(root, keep_last=3, writer_timeout_s=30)
    _writer_ready(mgr)
    mgr.save(1, {"app": t.app}).wait()
    t.step()
    victim = mgr.writer_pid if rank == 0 else None
    if victim:
        _stop(victim)  # it receives the job but cannot finish it: the kill lands mid-save
    handle = mgr.save(2, {"app": t.app})
    if victim:
        os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    result: dict[str, Any] = {"victim": victim}
    try:
        handle.wait()
        result["error"] = None
    except WriterFailedError as exc:
        result["error"] = str(exc)
    result["report_s"] = time.monotonic() - t0
    result["latest_after_failure"] = mgr.latest()
    t.step()
    result["loaded"] = mgr.load({"app": Trainer(rank, seed=9).app})
    mgr.save(3, {"app": t.app}).wait()
    result["latest_after_retry"] = mgr.latest()
    result["new_writer"] = mgr.writer_pid != victim
    mgr.close()
    return result


def hang_writer(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """Rank 1's writer hangs (SIGSTOP): both ranks fail within writer_timeout_s + grace."""
    t = Trainer(rank)
    mgr = CheckpointManager(root, keep_last=3, writer_timeout_s=3)
    _writer_ready(mgr)
    mgr.save(1, {"app": t.app}).wait()
    victim = mgr.writer_pid if rank == 1 else None
    if victim:
        _stop(victim)
    handle = mgr.save(2, {"app": t.app})
    t0 = time.monotonic()
    result: dict[str, Any] = {}
    try:
        handle.wait()
        result["error"] = None
    except WriterFailedError as exc:
        result["error"] = str(exc)
    result["report_s"] = time.monotonic() - t0
    mgr.save(3, {"app": t.app}).wait()
    result["latest_after_retry"] = mgr.latest()
    mgr.close()
    return result


def corrupt(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """Damage the newest step three ways; each load falls back to the previous complete step."""
    t = Trainer(rank)
    mgr = CheckpointManager(root, keep_last=None)
    for step in (1, 2, 3, 4):
        t.step()
        mgr.save(step, {"app": t.app})
    mgr.wait()
    loads = []
    damages = [
        (4, "__1_0.distcp", "truncate"),
        (3, "__0_0.distcp", "flip"),  # checksummed by rank 1 only: rank 0 must follow
        (2, "manifest.json", "delete"),
    ]
    for step, name, how in damages:
        dist.barrier()
        if rank == 0:
            path = root / f"step_{step:09d}" / name
            if how == "truncate":
                os.truncate(path, path.stat().st_size // 2)
            elif how == "flip":
                data = bytearray(path.read_bytes())
                data[len(data) // 2] ^= 0x01
                path.write_bytes(bytes(data))
            else:
                path.unlink()
        dist.barrier()
        loads.append(mgr.load({"app": Trainer(rank, seed=5).app}))
    dist.barrier()
    if rank == 0:
        (root / "step_000000001" / "manifest.json").unlink()
    dist.barrier()
    try:
        mgr.load({"app": Trainer(rank, seed=5).app})
        all_bad = None
    except CheckpointCorruptError as exc:
        all_bad = str(exc)
    mgr.close()
    return {"loads": loads, "all_bad": all_bad}


class _Warnings(logging.Handler):
    """Keeps the checkpoint package's warnings of this rank, to hand them to the test."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def corrupt_shard_elsewhere(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """Flip a byte of a shard that only the last rank checksums; every rank falls back a step."""
    warnings = _Warnings()
    logging.getLogger("resiliency.checkpoint").addHandler(warnings)
    world = dist.get_world_size()
    t = Trainer(rank)
    mgr = CheckpointManager(root, keep_last=None)
    for step in (1, 2):
        t.step()
        mgr.save(step, {"app": t.app})
    mgr.wait()
    step_dir = root / "step_000000002"
    names = sorted(json.loads((step_dir / "manifest.json").read_text())["files"])
    # File i of the manifest is checksummed by rank i % world alone (see _layout.verify_step).
    checker = world - 1
    name = next(n for i, n in enumerate(names) if n.endswith(".distcp") and i % world == checker)
    dist.barrier()
    if rank == 0:
        data = bytearray((step_dir / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (step_dir / name).write_bytes(bytes(data))
    dist.barrier()
    loaded = mgr.load({"app": Trainer(rank, seed=5).app})
    mgr.close()
    return {
        "loaded": loaded,
        "damaged": str(step_dir / name),
        "checker": checker,
        "warnings": warnings.messages,
    }


def _tmp_of(root: Path, step: int) -> Path:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = list(root.glob(f".tmp-step_{step}-*"))
        if found:
            return found[0]
        time.sleep(0.01)
    raise TimeoutError(f"no temporary directory for step {step}")


def disk_full(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """ENOSPC during a save: fails loudly on every rank, training goes on, step 1 intact.

    With ``CKPT_TEST_BIG`` set (tmpfs mode) the save of step 2 carries a tensor larger than the
    file system; otherwise rank 1's shard of step 2 is a symlink to /dev/full.
    """
    big = os.environ.get("CKPT_TEST_BIG")
    t = Trainer(rank)
    mgr = CheckpointManager(root, keep_last=3, writer_timeout_s=30)
    _writer_ready(mgr)
    mgr.save(1, {"app": t.app}).wait()
    t.step()
    state: dict[str, Any] = {"app": t.app}
    victim = None
    if big:
        state["big"] = torch.ones(int(big) // 4)  # replicated: written once, by one rank
    elif rank == 1:
        victim = mgr.writer_pid
        assert victim
        _stop(victim)
    handle = mgr.save(2, state)
    if victim:
        (_tmp_of(root, 2) / "__1_0.distcp").symlink_to("/dev/full")
        os.kill(victim, signal.SIGCONT)
    result: dict[str, Any] = {}
    try:
        handle.wait()
        result["error"] = None
    except SaveFailedError as exc:
        result["error"] = str(exc)
        result["writer_failed"] = isinstance(exc, WriterFailedError)
    result["latest_after_failure"] = mgr.latest()
    t.step(2)  # training goes on
    result["loaded"] = mgr.load({"app": Trainer(rank, seed=3).app})
    mgr.save(3, {"app": t.app}).wait()
    result["steps"] = mgr.steps()
    result["leftovers"] = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
    mgr.close()
    return result


def retention_inflight(rank: int, root: Path, out: Path) -> dict[str, Any]:
    """keep_last + keep_every; a no-op re-save; a new save waits for the one in flight."""
    t = Trainer(rank)
    mgr = CheckpointManager(root, keep_last=2, keep_every=4)
    _writer_ready(mgr)
    for step in range(1, 9):
        t.step()
        mgr.save(step, {"app": t.app})
    mgr.wait()
    result: dict[str, Any] = {"steps": mgr.steps(), "latest": mgr.latest()}
    again = mgr.save(8, {"app": t.app})
    result["resave_done"] = again.done()
    result["steps_after_resave"] = mgr.steps()
    victim = mgr.writer_pid if rank == 1 else None
    if victim:
        _stop(victim)
        threading.Timer(1.5, os.kill, (victim, signal.SIGCONT)).start()
    first = mgr.save(9, {"app": t.app})
    result["first_done_at_return"] = first.done() if rank == 1 else None
    t0 = time.monotonic()
    mgr.save(10, {"app": t.app})
    result["second_save_s"] = time.monotonic() - t0
    result["nine_committed_when_ten_returned"] = 9 in mgr.steps()
    mgr.wait()
    result["final_steps"] = mgr.steps()
    mgr.close()
    return result


SCENARIOS = {
    f.__name__: f
    for f in (
        train_resume,
        kill_writer,
        hang_writer,
        corrupt,
        corrupt_shard_elsewhere,
        disk_full,
        retention_inflight,
    )
}


def main() -> int:
    root, scenario, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    rank = int(os.environ["RANK"])
    logging.basicConfig(
        level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s"
    )
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # env:// from rank_group
    result = SCENARIOS[scenario](rank, root, out)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
