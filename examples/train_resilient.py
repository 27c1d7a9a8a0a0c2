"""Plain PyTorch DDP training (CPU, gloo) with the whole toolkit, one line per piece.

- heartbeats to the rank monitor (``RankMonitorClient``): a hang is caught and the group restarted;
- asynchronous, verified checkpoints (``CheckpointManager`` + ``AppState``), resumed on start;
- an agreed emergency checkpoint on SIGTERM/SIGUSR1 (``EmergencyCheckpoint``);
- goodput: one ``recorder.step(n)`` per step (the launcher, the checkpoint package and this line
  write the whole ledger).

    ft-launcher --nproc-per-node 2 --max-restarts 5 --goodput-dir /tmp/ledger \\
        --ft-initial-rank-heartbeat-timeout 30 --ft-rank-heartbeat-timeout 5 \\
        examples/train_resilient.py --ckpt-dir /tmp/ckpt --steps 200

Run it under ``resiliency-simulate`` to inject faults from outside (see docs/simulator.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from resiliency.checkpoint import AppState, CheckpointManager, EmergencyCheckpoint, SaveFailedError
from resiliency.ft import RankMonitorClient
from resiliency.goodput import get_recorder

log = logging.getLogger("train_resilient")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds per step (sleep)")
    parser.add_argument("--width", type=int, default=64, help="hidden width of the model")
    parser.add_argument("--sync-save", action="store_true", help="block on every save")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, args.width), nn.ReLU(), nn.Linear(args.width, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    state = {"app": AppState(ddp, opt)}
    manager = CheckpointManager(
        args.ckpt_dir, keep_last=args.keep_last, async_save=not args.sync_save
    )
    # Installed before the (possibly long) load, so a preemption during it is not lost.
    emergency = EmergencyCheckpoint(manager, signals=(signal.SIGTERM, signal.SIGUSR1), lead=2)
    start = manager.load(state) or 0
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"rank {rank}: attempt {attempt} starts at step {start}", flush=True)
    recorder = get_recorder()

    loss = torch.tensor(0.0)
    for step in range(start + 1, args.steps + 1):
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
    try:
        manager.save(args.steps, state).wait()
    except SaveFailedError as exc:  # the previous step stays intact; say so and go on
        log.error("rank %d: final save of step %d failed: %s", rank, args.steps, exc)
    manager.close()
    emergency.close()
    if rank == 0:
        print(f"rank 0: finished {args.steps} steps, loss {loss.item():.4f}", flush=True)
    client.shutdown_workload_monitoring()
    # Free the DDP model before the process group: a gloo group whose last reference its
    # reducer drops is destroyed with the GIL held and can deadlock (pytorch/pytorch#56297).
    del ddp, state
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
