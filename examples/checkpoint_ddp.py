"""DDP training on CPU (gloo) that checkpoints asynchronously and resumes from the latest step.

    python -m torch.distributed.run --nproc-per-node 2 examples/checkpoint_ddp.py \\
        --ckpt-dir /tmp/ckpt --steps 40 --save-every 5

Run it again with the same ``--ckpt-dir`` and it resumes from the newest step that verifies on
every rank (``--stop-at N`` ends the first run early, as a preemption would).
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from resiliency.checkpoint import AppState, CheckpointManager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--stop-at", type=int, default=None, help="end this run after step N")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)  # each rank draws its own data; AppState keeps this RNG per rank
    app = AppState(model, optimizer, samples_seen=0)

    manager = CheckpointManager(args.ckpt_dir, keep_last=2)
    start = manager.load({"app": app}) or 0  # the step loaded, agreed by every rank
    print(f"rank {rank}: resumed from step {start}", flush=True)

    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 16)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        app.extra["samples_seen"] += len(x)
        if step % args.save_every == 0:
            manager.save(step, {"app": app})  # returns once staged; the writer does the rest
        if args.stop_at is not None and step >= args.stop_at:
            break

    manager.close()  # waits for the save in flight
    print(
        f"rank {rank}: stopped at step {step}, loss {loss.item():.4f}, "
        f"samples {app.extra['samples_seen']}, latest checkpoint {manager.latest()}",
        flush=True,
    )
    # Free the DDP model before the process group: a gloo group whose last reference its
    # reducer drops is destroyed with the GIL held and can deadlock (pytorch/pytorch#56297).
    del model, app
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
