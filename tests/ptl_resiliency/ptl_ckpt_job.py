"""A 2-rank Lightning DDP job (CPU, gloo) with the checkpoint callbacks; the tests run it.

Lightning starts the second rank itself (``devices=2``). Markers under ``<work-dir>/markers``:
``ready-<rank>-<pid>`` after the first step. Rank 0 prints ``PTL_CKPT_RESULT {...}`` at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning_flavour import Callback, DDPStrategy, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from resiliency.ptl import DistributedCheckpointCallback, EmergencyCheckpointCallback


class Model(LightningModule):
    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.step_time = step_time

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.step_time:
            time.sleep(self.step_time)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 7)}

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(4096, 8, generator=gen)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


class Ready(Callback):
    def __init__(self, markers: Path) -> None:
        self.markers = markers
        self.done = False

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if not self.done:
            self.done = True
            (self.markers / f"ready-{trainer.global_rank}-{os.getpid()}").touch()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--max-steps", type=int, default=100000)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--lead", type=int, default=2)
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {os.environ.get('LOCAL_RANK', '0')}] %(levelname)s %(name)s: %(message)s",
    )
    markers = args.work_dir / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    ckpt = DistributedCheckpointCallback(
        args.work_dir / "ckpt", every_n_train_steps=args.every, keep_last=None
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=240)),
        max_steps=args.max_steps,
        callbacks=[ckpt, EmergencyCheckpointCallback(lead=args.lead), Ready(markers)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    model = Model(args.step_time)
    trainer.fit(model)
    if trainer.is_global_zero:
        result = {
            "resumed_from": ckpt.resumed_step,
            "global_step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "weight": model.layer.weight.detach().flatten().tolist(),
        }
        print("PTL_CKPT_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
