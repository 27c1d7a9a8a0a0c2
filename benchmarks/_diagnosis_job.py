"""The job of the scored diagnosis run (bench_diagnosis_score.py): DDP on CPU, the whole toolkit.

examples/train_resilient.py plus the two faults the simulator cannot inject from outside, as a
job option each (the benchmark records what it configured, as the simulator records what it
injected):

- ``--bad-batch-rank R --bad-batch-step S``: rank R raises the same ValueError at step S in
  every attempt (a deterministic data error);
- ``--stall-node N --stall-step S --stall-fifo PATH``: every rank of node N blocks in a read of
  a shard (opening a FIFO nobody writes) at step S, while the other nodes' ranks wait for them
  in DDP's all-reduce (a stalled file system).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from resiliency.checkpoint import AppState, CheckpointManager, EmergencyCheckpoint
from resiliency.ft import RankMonitorClient
from resiliency.goodput import get_recorder


def read_shard(path: Path) -> bytes:
    """Read one shard of the data set: blocks while the file system (here a FIFO) stalls."""
    with path.open("rb") as shard:
        return shard.read()


@record
def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--bad-batch-rank", type=int, default=-1)
    parser.add_argument("--bad-batch-step", type=int, default=0)
    parser.add_argument("--stall-node", type=int, default=-1)
    parser.add_argument("--stall-step", type=int, default=0)
    parser.add_argument("--stall-fifo", type=Path)
    args = parser.parse_args()
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ.get("GROUP_RANK", "0"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    state = {"app": AppState(ddp, opt)}
    manager = CheckpointManager(args.ckpt_dir, keep_last=2, async_save=True)
    emergency = EmergencyCheckpoint(manager, signals=(signal.SIGTERM, signal.SIGUSR1), lead=2)
    start = manager.load(state) or 0
    recorder = get_recorder()
    for step in range(start + 1, args.steps + 1):
        if node == args.stall_node and step == args.stall_step and args.stall_fifo:
            read_shard(args.stall_fifo)
        if rank == args.bad_batch_rank and step >= args.bad_batch_step > 0:
            raise ValueError(f"bad batch at step {step}: label 7 is out of range [0, 5)")
        gen = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        client.send_heartbeat()
        recorder.step(step)
        if emergency.should_stop(step):
            emergency.save_and_exit(step, state)
        if step % args.ckpt_every == 0:
            manager.save(step, state)
    manager.close()
    emergency.close()
    client.shutdown_workload_monitoring()
    del ddp, state
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
