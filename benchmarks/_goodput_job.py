"""The training job of the goodput benchmark: Lightning DDP on CPU with a fixed step time.

    --setup torchrun   Lightning's own ModelCheckpoint (torch.save, every --persistent-every
                       steps, resume from last.ckpt); a passive callback only writes the ledger
    --setup toolkit    resiliency's callbacks: heartbeats, asynchronous verified checkpoints
                       (local tier every --local-every steps with a replica on the other node,
                       persistent every --persistent-every steps), emergency checkpoint

Both record the same goodput ledger (steps, saves, loads), so one calculator reads both.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L  # noqa: N812 (the name Lightning documents)
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, Dataset

from resiliency.goodput import get_recorder


class _Random(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum(0, keepdim=True)


class _Model(L.LightningModule):
    def __init__(self, step_time: float, width: int) -> None:
        super().__init__()
        self.step_time = step_time
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_time)  # a fixed step time, whatever the machine does
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class _TimedModelCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, unchanged, plus ledger events around each (blocking) save."""

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        rec, step = get_recorder(), int(trainer.global_step)
        rec.emit("checkpoint_save_started", step=step, tier="persistent")
        t0 = time.monotonic()
        super()._save_checkpoint(trainer, filepath)
        took = time.monotonic() - t0
        size = Path(filepath).stat().st_size if os.path.exists(filepath) else 0
        rec.emit(
            "checkpoint_saved",
            step=step,
            tier="persistent",
            bytes=size,
            blocked_s=took,
            total_s=took,
        )


class _LedgerSteps(L.Callback):
    """Passive: one step event per step, and the load of last.ckpt (torchrun setup only)."""

    def __init__(self) -> None:
        self._load_t0: float | None = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: Any) -> None:
        get_recorder().emit(
            "checkpoint_loaded",
            step=int(checkpoint.get("global_step", 0)),
            tier="persistent",
            bytes=0,
            duration_s=time.monotonic() - (self._load_t0 or time.monotonic()),
        )

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        get_recorder().step(int(trainer.global_step))

    def mark_load_start(self) -> None:
        get_recorder().emit("checkpoint_load_started", tier="persistent")
        self._load_t0 = time.monotonic()


def _toolkit_callbacks(args: argparse.Namespace) -> list[L.Callback]:
    from resiliency.ptl import (  # noqa: PLC0415 - only this setup needs the toolkit
        DistributedCheckpointCallback,
        EmergencyCheckpointCallback,
        FaultToleranceCallback,
        LocalCheckpointCallback,
    )

    checkpoints: L.Callback
    if args.local_dir is not None:
        # The simulated node's index names its failure domain: the group rank of a node can
        # change when a replaced node joins again, its local disk cannot.
        checkpoints = LocalCheckpointCallback(
            args.local_dir,
            local_ckpt_interval=args.local_every,
            persistent_ckpt_dir=args.ckpt_dir,
            persistent_ckpt_interval=args.persistent_every,
            replicas=1,
            keep_last=2,
            node=os.environ.get("RESILIENCY_SIM_NODE"),
            replication_timeout_s=60.0,
        )
    else:
        checkpoints = DistributedCheckpointCallback(
            args.ckpt_dir, every_n_train_steps=args.persistent_every, keep_last=2
        )
    return [
        # Hang timeouts calculated from what the job's ranks observed (after a load and a save:
        # from the first restart on), kept across restarts in one state file.
        FaultToleranceCallback(
            autoresume=False,
            calculate_timeouts=True,
            exp_dir=args.ckpt_dir.parent / "ft_state",
        ),
        checkpoints,
        EmergencyCheckpointCallback(lead=2),
    ]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setup", choices=["torchrun", "toolkit"], required=True)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--persistent-every", type=int, default=50)
    p.add_argument("--local-dir", type=Path, help="toolkit: this node's local checkpoint tier")
    p.add_argument("--local-every", type=int, default=10)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--gloo-timeout", type=float, default=60.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = _Model(args.step_time, args.width)
    # One epoch is exactly max_steps on every rank. The sampler builds a list of every index at
    # each start, so an oversized dataset costs seconds per restart (5 s for 6.4 M samples here).
    world = int(os.environ.get("WORLD_SIZE", "1"))
    data = DataLoader(_Random(args.steps * 8 * world), batch_size=8)
    strategy = DDPStrategy(
        process_group_backend="gloo", timeout=timedelta(seconds=args.gloo_timeout)
    )
    common: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "num_nodes": int(os.environ.get("WORLD_SIZE", "1"))
        // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "strategy": strategy,
        "max_steps": args.steps,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    if args.setup == "torchrun":
        steps = _LedgerSteps()
        ckpt = _TimedModelCheckpoint(
            dirpath=args.ckpt_dir, every_n_train_steps=args.persistent_every, save_last=True
        )
        trainer = L.Trainer(callbacks=[steps, ckpt], enable_checkpointing=True, **common)
        last = args.ckpt_dir / "last.ckpt"
        if last.exists():
            steps.mark_load_start()
        trainer.fit(model, data, ckpt_path=str(last) if last.exists() else None)
    else:
        trainer = L.Trainer(
            callbacks=_toolkit_callbacks(args), enable_checkpointing=False, **common
        )
        trainer.fit(model, data)


if __name__ == "__main__":
    main()
