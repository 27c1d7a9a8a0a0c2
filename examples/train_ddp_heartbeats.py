"""Tiny DDP training on CPU (gloo) whose progress ft-launcher watches through heartbeats.

Each rank trains a small linear model on synthetic data, sends a heartbeat after every step,
checkpoints (model, optimizer, step and the rank monitor's calculated timeouts) every few steps,
resumes from the checkpoint after a restart, and creates the finished flag at the end.

    ft-launcher --nproc-per-node 2 --max-restarts 3 \\
        --ft-initial-rank-heartbeat-timeout 60 --ft-rank-heartbeat-timeout 5 \\
        examples/train_ddp_heartbeats.py --ckpt-dir /tmp/ckpt

With ``--goodput-dir DIR`` the launcher records the job's cycles and hangs, and this script adds
its steps and checkpoints (``recorder.step(n)``, two ``emit`` calls): ``resiliency-goodput report
DIR`` then says where the time went.

Inject a hang: ``--hang-rank 1 --hang-step 8`` (rank 1 stops at step 8, only on the first attempt,
i.e. while TORCHELASTIC_RESTART_COUNT is 0). ``--crash-rank``/``--crash-step`` kill a rank instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from resiliency.ft import RankMonitorClient
from resiliency.goodput import get_recorder


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step")
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=-1)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--fault-attempt", type=int, default=0, help="attempt the fault fires on")
    parser.add_argument(
        "--fault-once-file",
        type=Path,
        default=None,
        help="fire the fault only if this file does not exist yet (then create it); for "
        "auto-resume, where every launcher run starts again at attempt 0",
    )
    parser.add_argument(
        "--calc-timeouts-after",
        type=int,
        default=0,
        help="after this many steps, set heartbeat timeouts from the observed intervals (0: no)",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    inject = attempt == args.fault_attempt
    if inject and args.fault_once_file is not None:
        inject = not args.fault_once_file.exists()
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    recorder = get_recorder()  # a no-op unless the launcher got --goodput-dir

    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ckpt_path = args.ckpt_dir / "ckpt.pt"
    start = 0
    if ckpt_path.exists():
        began = time.monotonic()
        state = torch.load(ckpt_path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        client.load_state_dict(state["ft"])
        start = int(state["step"])
        if rank == 0:
            took, size = time.monotonic() - began, ckpt_path.stat().st_size
            recorder.emit(
                "checkpoint_loaded", step=start, tier="persistent", bytes=size, duration_s=took
            )
        print(f"rank {rank}: attempt {attempt} resumes at step {start}", flush=True)

    def save(step: int) -> None:
        began = time.monotonic()
        if rank == 0:
            args.ckpt_dir.mkdir(parents=True, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "ft": client.state_dict(),
            }
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save(state, tmp)
            os.replace(tmp, ckpt_path)
        dist.barrier()
        if rank == 0:
            took, size = time.monotonic() - began, ckpt_path.stat().st_size
            recorder.emit(
                "checkpoint_saved",
                step=step,
                tier="persistent",
                bytes=size,
                blocked_s=took,
                total_s=took,
            )

    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if inject and step == args.hang_step and rank == args.hang_rank:
            if args.fault_once_file is not None:
                args.fault_once_file.touch()
            print(f"rank {rank}: injected hang at step {step}", flush=True)
            time.sleep(3600)
        if inject and step == args.crash_step and rank == args.crash_rank:
            if args.fault_once_file is not None:
                args.fault_once_file.touch()
            print(f"rank {rank}: injected crash at step {step}", flush=True)
            os._exit(13)
        time.sleep(args.step_time)
        client.send_heartbeat()
        recorder.step(step + 1)
        if args.calc_timeouts_after and step + 1 == args.calc_timeouts_after:
            client.calculate_and_set_hb_timeouts()
        if (step + 1) % args.ckpt_every == 0:
            save(step + 1)
    save(args.steps)

    if rank == 0:
        print(f"rank 0: finished {args.steps} steps, loss {loss.item():.4f}", flush=True)
        flag = os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE")
        if flag:
            Path(flag).touch()
    client.shutdown_workload_monitoring()
    # Free the DDP model before the process group: a gloo group whose last reference its
    # reducer drops is destroyed with the GIL held and can deadlock (pytorch/pytorch#56297).
    del ddp
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
