"""A tiny Lightning job with the three resiliency callbacks; runs on CPU in seconds.

Under ft-launcher (hang detection, in-job restarts, resume from the last checkpoint)::

    export FAULT_TOL_FINISHED_FLAG_FILE=$PWD/run/finished.flag
    ft-launcher --standalone --nproc-per-node 2 --max-restarts 2 \
        --ft-param-initial_rank_heartbeat_timeout 120 --ft-param-rank_heartbeat_timeout 5 \
        examples/ptl_train.py --work-dir run --ft heartbeats --autoresume \
        --calculate-timeouts --fault rank_hung --fault-delay 3 --max-steps 60 --step-time 0.05

Without a launcher (straggler detection only; Lightning starts the second process)::

    python examples/ptl_train.py --work-dir run --ft none --devices 2 --straggler \
        --slow-rank 1 --slow-factor 2

Every run resumes from ``<work-dir>/checkpoints/last.ckpt`` when it exists. A simulated fault
(``--fault``) fires only in a run that starts from scratch (unless ``--fault-when always``), so the
restarted run can finish.
Rank 0 prints one JSON line at the end: ``PTL_TRAIN_RESULT {...}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from resiliency.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    StragglerDetectionCallback,
)


class TinyModel(LightningModule):
    """Linear regression; ``step_time`` seconds of simulated work per step, more on a slow rank."""

    def __init__(self, step_time: float = 0.0, slow_rank: int = -1, slow_factor: float = 1.0):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.step_time = step_time
        self.slow_rank = slow_rank
        self.slow_factor = slow_factor

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        delay = self.step_time
        if self.global_rank == self.slow_rank:
            delay *= self.slow_factor
        if delay:
            time.sleep(delay)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(256, 8, generator=gen)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def build_parser() -> argparse.ArgumentParser:
    """The command line of this example (tests extend it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, required=True, help="checkpoints, logs, FT state")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.02, help="seconds of work per step")
    p.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--devices", type=int, default=1, help="ranks when not under a launcher")
    p.add_argument("--ft", choices=["heartbeats", "sections", "none"], default="heartbeats")
    p.add_argument("--autoresume", action="store_true")
    p.add_argument("--calculate-timeouts", action="store_true")
    p.add_argument("--fault", choices=["rank_killed", "rank_hung", "random"])
    p.add_argument("--fault-delay", type=float, default=2.0)
    p.add_argument("--fault-rank", type=int, default=None)
    p.add_argument(
        "--fault-when",
        choices=["fresh", "always"],
        default="fresh",
        help="simulate the fault only in a run that starts from scratch (default), or always",
    )
    p.add_argument("--straggler", action="store_true", help="add StragglerDetectionCallback")
    p.add_argument("--straggler-interval", type=float, default=1.0)
    p.add_argument("--stop-if-detected", action="store_true")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.0)
    return p


def _last_checkpoint(work_dir: Path) -> Path | None:
    last = work_dir / "checkpoints" / "last.ckpt"
    return last if last.exists() else None


def build_callbacks(args: argparse.Namespace, resuming: bool, **ft_kwargs: Any) -> list[Callback]:
    """The resiliency callbacks the command line asks for."""
    callbacks: list[Callback] = []
    fault = None
    if args.fault and (args.fault_when == "always" or not resuming):
        fault = {
            "fault_type": args.fault,
            "base_delay": args.fault_delay,
            "rank_to_fail": args.fault_rank,
        }
    common = {
        "autoresume": args.autoresume,
        "calculate_timeouts": args.calculate_timeouts,
        "simulated_fault_params": fault,
        "exp_dir": args.work_dir / "ft_state",
    }
    if args.ft == "heartbeats":
        callbacks.append(FaultToleranceCallback(**common))
    elif args.ft == "sections":
        callbacks.append(FaultToleranceSectionsCallback(**common, **ft_kwargs))
    if args.straggler:
        callbacks.append(
            StragglerDetectionCallback(
                report_time_interval=args.straggler_interval,
                calc_relative_gpu_perf=True,
                calc_individual_gpu_perf=True,
                num_gpu_perf_scores_to_print=3,
                gpu_relative_perf_threshold=0.75,
                gpu_individual_perf_threshold=0.75,
                stop_if_detected=args.stop_if_detected,
                enable_ptl_logging=True,
            )
        )
    return callbacks


def run(
    args: argparse.Namespace,
    model: LightningModule | None = None,
    **ft_kwargs: Any,
) -> dict[str, Any]:
    """Fit, resuming from the last checkpoint if there is one; return a summary."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {os.environ.get('RANK', os.environ.get('LOCAL_RANK', '0'))}] "
        "%(name)s %(levelname)s: %(message)s",
    )
    ckpt = _last_checkpoint(args.work_dir)
    model = model or TinyModel(args.step_time, args.slow_rank, args.slow_factor)
    callbacks = build_callbacks(args, resuming=ckpt is not None, **ft_kwargs)
    callbacks.append(
        ModelCheckpoint(
            dirpath=args.work_dir / "checkpoints",
            every_n_train_steps=args.ckpt_every,
            save_top_k=-1,
            save_last=True,
        )
    )
    # Under a torchrun-style launcher Lightning uses the launcher's processes.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", args.devices))
    strategy: Any = "auto"
    if devices > 1 or "LOCAL_WORLD_SIZE" in os.environ:
        # A short collective timeout: a peer that died must not hold this rank for 30 minutes.
        strategy = DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=60))
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=args.max_steps,
        callbacks=callbacks,
        logger=CSVLogger(args.work_dir, name="logs", version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    started = time.monotonic()
    trainer.fit(model, ckpt_path=str(ckpt) if ckpt else None)
    return {
        "resumed_from": str(ckpt) if ckpt else None,
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "seconds": round(time.monotonic() - started, 3),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "is_global_zero": trainer.is_global_zero,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run(args)
    if result["is_global_zero"]:
        print("PTL_TRAIN_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
