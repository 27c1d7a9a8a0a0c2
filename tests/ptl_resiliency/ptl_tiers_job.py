"""A 2-rank Lightning DDP job (CPU, gloo) with LocalCheckpointCallback; each rank plays a node.

Lightning starts rank 1 itself (``devices=2``); ``node=LOCAL_RANK`` makes the two ranks two
failure domains with their own local directories (``<work>/node<r>``). Rank 0 prints
``PTL_TIERS_RESULT {...}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from lightning_flavour import DDPStrategy, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from resiliency.ptl import LocalCheckpointCallback


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(1024, 8, generator=gen)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--persistent", default=None, help="URL (default: <work-dir>/persistent)")
    p.add_argument(
        "--no-final-save",
        action="store_true",
        help="save_on_train_end=False: the last step stays where the cadence put it",
    )
    args = p.parse_args()
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(name)s: %(message)s")
    ckpt = LocalCheckpointCallback(
        args.work_dir / f"node{rank}",
        local_ckpt_interval=2,
        persistent_ckpt_dir=args.persistent or args.work_dir / "persistent",
        persistent_ckpt_interval=5,
        node=rank,
        replication_timeout_s=60,
        save_on_train_end=not args.no_final_save,
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=60)),
        max_steps=args.max_steps,
        callbacks=[ckpt],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    model = Model()
    trainer.fit(model)
    if trainer.is_global_zero:
        result = {
            "resumed_from": ckpt.resumed_step,
            "global_step": trainer.global_step,
            "weight": model.layer.weight.detach().flatten().tolist(),
        }
        print("PTL_TIERS_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
