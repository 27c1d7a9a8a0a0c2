"""A 2-rank DDP training job over gloo with an EmergencyCheckpoint; the emergency tests run it.

Runs as one process per rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` from the
environment: the test's own spawner or ft-launcher). It resumes from the newest complete step under
``--root``, trains, and on a signal every rank stops at the agreed step, saves it and exits.

Saver ``simple``: torch.save per rank + barrier + a commit marker (independent of the manager);
saver ``manager``: ``resiliency.checkpoint.CheckpointManager`` with ``AppState``.
Markers (files under ``--root/markers``): ``ready-<rank>-<pid>`` after the first step,
``saving-<rank>-<step>`` while a periodic save runs. Rank 0 prints ``RESUMED <step>``.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from resiliency.checkpoint import AppState, CheckpointManager, EmergencyCheckpoint


class SimpleSaver:
    """Blocking per-rank torch.save; a step counts once rank 0 wrote COMMITTED after a barrier."""

    def __init__(self, root: Path, rank: int, sleep: float, markers: Path) -> None:
        self.root = root
        self.rank = rank
        self.sleep = sleep
        self.markers = markers

    def save(self, step: int, state: dict[str, Any]) -> None:
        marker = self.markers / f"saving-{self.rank}-{step}"
        marker.touch()
        directory = self.root / f"step_{step:09d}"
        directory.mkdir(parents=True, exist_ok=True)
        if self.sleep:
            time.sleep(self.sleep)
        data = {k: v.state_dict() for k, v in state.items()}
        torch.save(data, directory / f"rank_{self.rank}.pt")
        dist.barrier()
        if self.rank == 0:
            (directory / "COMMITTED").touch()
        dist.barrier()
        marker.unlink()

    def latest(self) -> int | None:
        steps = sorted(int(p.parent.name[5:]) for p in self.root.glob("step_*/COMMITTED"))
        return steps[-1] if steps else None

    def load(self, state: dict[str, Any], step: int) -> None:
        data = torch.load(self.root / f"step_{step:09d}" / f"rank_{self.rank}.pt")
        for key, obj in state.items():
            obj.load_state_dict(data[key])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--lead", type=int, default=2)
    p.add_argument("--check-every", type=int, default=None)
    p.add_argument("--periodic-every", type=int, default=0)
    p.add_argument("--save-sleep", type=float, default=0.0)
    p.add_argument("--saver", choices=["simple", "manager"], default="manager")
    p.add_argument("--sigusr1", action="store_true", help="also stop on SIGUSR1")
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    logging.basicConfig(
        level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s"
    )
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=240))
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    markers = args.root / "markers"
    markers.mkdir(parents=True, exist_ok=True)

    if args.saver == "manager":
        mgr = CheckpointManager(args.root / "ckpt", keep_last=None, async_save=True)
        state: Any = {"app": AppState(model, opt)}
        start = mgr.load(state) or 0
        saver: Any = mgr
    else:
        saver = SimpleSaver(args.root / "ckpt", rank, args.save_sleep, markers)
        state = {"model": model, "opt": opt}
        latest = saver.latest()
        start = 0
        if latest is not None:
            saver.load(state, latest)
            start = latest
    if rank == 0:
        print(f"RESUMED {start}", flush=True)

    signals = (signal.SIGTERM, signal.SIGUSR1) if args.sigusr1 else (signal.SIGTERM,)
    ec = EmergencyCheckpoint(saver, signals=signals, lead=args.lead, check_every=args.check_every)
    gen = torch.Generator().manual_seed(rank)
    pending: tuple[Any, float] | None = None
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(8, 16, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # one allreduce per step: ranks drift at most one step apart
        opt.step()
        if args.step_time:
            time.sleep(args.step_time)
        if step == start + 1:
            (markers / f"ready-{rank}-{os.getpid()}").touch()
        if args.periodic_every and step % args.periodic_every == 0:
            pending = (saver.save(step, state), time.monotonic())
        if pending is not None and (pending[0] is None or pending[0].done()):
            ec.record_save(time.monotonic() - pending[1])  # the budget learns the save time
            pending = None
        if ec.should_stop(step):
            ec.save_and_exit(step, state)
    print(f"DONE rank {rank} of {world}", flush=True)
    # Free the DDP model before the process group: a gloo group whose last reference its
    # reducer drops is destroyed with the GIL held and can deadlock (pytorch/pytorch#56297).
    del model, state
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
