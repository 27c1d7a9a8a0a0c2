"""Multi-tier checkpoints in a plain PyTorch DDP loop: node-local often, persistent rarely.

    ft-launcher --nnodes 2 --nproc-per-node 8 ... examples/checkpoint_tiers.py \\
        --local-ckpt-dir /dev/shm/ckpt --local-ckpt-interval 10 \\
        --persistent-ckpt-dir /shared/ckpt --persistent-ckpt-interval 200 --steps 1000

The flags are those of Google's resiliency tool. Every ``--local-ckpt-interval`` steps each rank
saves its state to the node-local directory and a copy to a rank on another node; every
``--persistent-ckpt-interval`` steps the job also saves to the shared directory. On start, the
job resumes from the newest step every rank can assemble: own local copy, a peer's replica, or
the persistent tier. Runs as one process too (no replica then).
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from resiliency.checkpoint import AppState, CheckpointManager, LocalTier, PersistentTier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local-ckpt-dir", required=True, help="node-local directory (RAM disk, NVMe)")
    p.add_argument("--local-ckpt-interval", type=int, default=10, help="steps between local saves")
    p.add_argument(
        "--persistent-ckpt-dir",
        required=True,
        help="shared directory, or a URL (file://, s3://, gs://...)",
    )
    p.add_argument("--persistent-ckpt-interval", type=int, default=100)
    p.add_argument("--replicas", type=int, default=1, help="copies of each shard on other nodes")
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args()

    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if dist.is_initialized():
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"app": AppState(model, optimizer)}

    manager = CheckpointManager(
        None,
        tiers=[
            LocalTier(args.local_ckpt_dir, every=args.local_ckpt_interval, replicas=args.replicas),
            PersistentTier(args.persistent_ckpt_dir, every=args.persistent_ckpt_interval),
        ],
    )
    start = manager.load(state) or 0
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(f"resumed from step {start}" if start else "starting from scratch", flush=True)

    for step in range(start + 1, args.steps + 1):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        manager.save(step, state)  # a no-op on steps no tier is due on
    manager.close()
    if rank == 0:
        print(f"done at step {args.steps}; saved steps {manager.steps()}", flush=True)
    # Free the DDP model before the process group: a gloo group whose last reference its
    # reducer drops is destroyed with the GIL held and can deadlock (pytorch/pytorch#56297).
    del model, state
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
