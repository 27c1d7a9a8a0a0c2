"""FSDP2 (``fully_shard``) on gloo under ``inprocess.Wrapper``: on a fault, every rank rolls back
in the same process to the newest step that every rank holds in its local checkpoint tier.

Run by torchrun or ft-launcher (2 or 4 ranks). No peer holds a copy of a sharded rank's state,
so nothing is healed from memory: the training function builds the model, the optimizer and a
``CheckpointManager`` with a ``LocalTier`` at every iteration, on the new process group, and
``load`` restores the newest step that verifies on every rank (one step, agreed by all ranks).
The manager is closed in a ``finally`` inside the function, so a restart never leaves its writer
behind: with ``close(abort=True)`` when a fault elsewhere restarts the rank (``RankShouldRestart``:
no collective with the aborted group; a save in flight is given up), else ``close()``.

The job reports the step it reloaded to ``inprocess.Rollback`` (every rank's newest trained
step, the steps lost; rank 0 records it in the goodput ledger when ``RESILIENCY_GOODPUT_DIR``
is set, with rank 0's ``step`` events).

Each rank appends JSON lines to OUT/rank<rank>.jsonl: ``start`` (pid, iteration, the step
resumed from, the steps lost, this rank's shard of the parameters), ``params`` after every
step, ``closed`` (this process's checkpoint writer processes before and after the manager's
close; ``abort``: whether it was ``close(abort=True)``).
  --raise R@N   rank R raises at the start of step N in iteration 0
  --hang R@N    rank R sleeps in libc (GIL released) at the start of step N in iteration 0,
                again after every signal that does not raise (a stack dump), until the restart
  --kill R@N    rank R SIGKILLs itself at the start of step N in iteration 0 (N steps trained,
                the save of the newest multiple of --every just started), after a ``killed``
                record; under ft-launcher --ft-inprocess-respawn it is respawned alone and the
                new process joins at iteration 1 (a new process: it has trained no step)
  --kill-saved  with --kill: wait until the saves in flight landed (``mgr.wait()``) first
  --stale R     at iteration 1, rank R loses its newest local step (its save never landed)
  --soft S, --hard S   the Wrapper's soft and hard timeouts (seconds)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from resiliency import inprocess
from resiliency.checkpoint import AppState, CheckpointManager, LocalTier
from resiliency.goodput import get_recorder

RANK = int(os.environ["RANK"])


def shard(model: torch.nn.Module) -> list[float]:
    """This rank's shard of every parameter (DTensor's local part)."""
    return [float(v) for p in model.parameters() for v in p.to_local().detach().flatten()]  # type: ignore[operator]


def children() -> list[int]:
    """Pids of this process's live checkpoint writers (its children running the writer's entry;
    not the Wrapper's monitor process, a child of every rank too)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) != me or fields[0] == "Z":
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"_writer/__main__.py" in command:
            found.append(int(entry.name))
    return sorted(found)


def hang() -> None:
    """Sleep in libc with the GIL released; a signal without a Python exception (the monitor's
    stack dump) ends one sleep(), so sleep again: only the restart's exception ends this."""
    libc = ctypes.CDLL(None)
    while True:
        libc.sleep(600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--raise", dest="raise_", default="")
    parser.add_argument("--hang", default="")
    parser.add_argument("--kill", default="")
    parser.add_argument("--kill-saved", action="store_true")
    parser.add_argument("--stale", type=int, default=-1)
    parser.add_argument("--soft", type=float, default=60.0)
    parser.add_argument("--hard", type=float, default=90.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    fault_rank, _, fault_step = args.raise_.partition("@")
    hang_rank, _, hang_step = args.hang.partition("@")
    kill_rank, _, kill_step = args.kill.partition("@")
    log_path = args.out / f"rank{RANK}.jsonl"
    local = args.out / "local"

    def record(**fields: object) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps({"rank": RANK, "pid": os.getpid(), **fields}) + "\n")

    # outside the function: it keeps the newest step trained before a fault
    rollback = inprocess.Rollback()

    @inprocess.Wrapper(
        monitor_thread_interval=timedelta(seconds=0.2),
        heartbeat_interval=timedelta(seconds=0.5),
        soft_timeout=timedelta(seconds=args.soft),
        hard_timeout=timedelta(seconds=args.hard),
        barrier_timeout=timedelta(seconds=120),
    )
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> None:
        assert call_wrapper is not None
        it = call_wrapper.iteration
        base = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"fsdp/{it}", base),
            rank=RANK,
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timedelta(seconds=60),
        )
        torch.manual_seed(0)  # the initial weights; the step's own are loaded below
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        tier = LocalTier(local, every=args.every, replicas=0, node=f"node{RANK}")
        mgr = CheckpointManager(None, tiers=[tier])
        restarting = False
        try:
            if it == 1 and args.stale == RANK:
                newest = max(mgr.steps())
                shutil.rmtree(local / f"step_{newest:09d}" / f"shard_{RANK}")
            # the optimizer's state too (momentum): AppState goes through get_state_dict
            state = {"app": AppState(model, opt)}
            step = mgr.load(state) or 0
            resumed = rollback.resumed(step, call_wrapper=call_wrapper)
            record(
                event="start",
                iteration=it,
                step=step,
                lost=resumed.lost_steps,
                trained=list(resumed.trained_steps),
                params=shard(model),
            )
            while step < args.steps:
                if it == 0 and str(RANK) == fault_rank and step == int(fault_step):
                    raise RuntimeError(f"injected fault on rank {RANK} at step {step}")
                if it == 0 and str(RANK) == hang_rank and step == int(hang_step):
                    hang()
                if it == 0 and str(RANK) == kill_rank and step == int(kill_step):
                    if args.kill_saved:
                        mgr.wait()
                    record(event="killed", iteration=it, step=step, children=children())
                    os.kill(os.getpid(), signal.SIGKILL)
                g = torch.Generator().manual_seed(1000 * step + RANK)
                opt.zero_grad(set_to_none=True)
                model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
                opt.step()
                step += 1
                rollback.trained(step)
                get_recorder().step(step)  # rank 0's, into the ledger (no-op without one)
                record(event="params", iteration=it, step=step, params=shard(model))
                mgr.save(step, state)
            mgr.wait()
        except inprocess.exception.RankShouldRestart:
            # A fault elsewhere: the group is aborted and a peer may be dead, so the save in
            # flight cannot be agreed on; close(abort=True) gives it up without a collective.
            restarting = True
            raise
        finally:
            # Stops this iteration's writer (the next iteration builds its own manager on its
            # new group). Shielded: a peer's fault seen by the monitor waits for it, instead
            # of interrupting it half-way and leaving the writer behind; not progress.
            with call_wrapper.atomic(progress=False):
                before = children()
                mgr.close(abort=restarting)
                record(
                    event="closed",
                    iteration=it,
                    before=before,
                    after=children(),
                    abort=restarting,
                )
        dist.destroy_process_group()

    train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
