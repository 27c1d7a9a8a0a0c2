"""A DDP training job on gloo under resiliency.inprocess.Wrapper, with faults injected by args.

Run by torchrun. Each rank appends JSON lines to OUT/rank<initial>.jsonl: one ``start`` line
per iteration (pid, iteration, step, the parameters at that step), one ``step`` line per
completed step, and ``done`` with the final parameters; rank 0 records its steps in the
goodput ledger when ``RESILIENCY_GOODPUT_DIR`` is set. The model, optimizer and step live
outside the wrapped function, so a restart in the same process continues from memory.

Faults (only in the iteration given, so the restart is clean):
  --raise R@N        rank R raises RuntimeError at the start of step N
  --hang R@N         rank R sleeps in libc (GIL released) at the start of step N
  --hang-masked R@N  the same with the restart signal blocked: it cannot be interrupted (first
                     launcher attempt only)
  --hang-gil R@N     rank R sleeps in libc holding the GIL at the start of step N: no thread of
                     its own can run, only its monitor process can end it (first launcher
                     attempt only)
  --stuck-in-except R@N  rank R sleeps in libc (GIL released) at the start of step N until the
                     restart's RankShouldRestart, catches it and sleeps in libc again in its
                     ``except`` (re-called after any signal): it never comes back to the
                     wrapper (first launcher attempt only)
  --init-raise R@I   rank R's initialize raises at iteration I (a fault during the restart)
  --unhealthy R      rank R's health check fails after any fault: it leaves the job
  --kill R@N         rank R SIGKILLs itself at the start of step N (first launcher attempt
                     only); under ft-launcher --ft-inprocess-respawn it is respawned alone
  --sigterm R@N      rank R sends itself SIGTERM at the start of step N (first launcher attempt
                     only): a stop request from outside, which the launcher never respawns alone
  --respawn-delay S  a respawned process sleeps S seconds before it enters the Wrapper

Repeated faults (the stop rule, ``Wrapper(max_repeated_faults=...)``):
  --value-error R@N        rank R raises the same ValueError at the start of step N in every
                           iteration (a deterministic fault)
  --value-error R@N1,N2,.. the same ValueError at step N1 in iteration 0, N2 in iteration 1, ...
  --ping                   call CallWrapper.ping() after every step (progress the rule sees)
  --max-repeated K         Wrapper(max_repeated_faults=K); 0 for None (no limit)

Healing (``--heal``): a ``Healer`` holds the model and the optimizer; every iteration heals
before DDP is built and records a ``heal`` line, and the optimizer step is ``Healer.updating``.
  --momentum M            SGD momentum (the optimizer then has state to heal)
  --raise-mid-update R@N  rank R updates its weight alone inside the optimizer step of step N,
                          then raises: its state is half-updated
  --forget R              at iteration 1, rank R re-initialises its model and optimizer as a
                          new process would (its state is missing)

``--check-freed``: every iteration after the first records a ``freed`` line: whether the
previous iteration's DDP model and process group were freed (weak references) by then.

``--tree-hosts K``: ``rank_assignment=Tree(...)`` over "hosts" of K consecutive ranks with at
most one active rank per host, the others spares (NVRx's ``Tree``/``Layer``/``LayerFlag``).

``--store-port P``: ``store_kwargs={"port": P}``: rank 0 hosts the Wrapper's store there (even
under ft-launcher --ft-inprocess-respawn, whose launcher otherwise hosts it).

``--auto-restart DELAY``: ``inprocess.auto_restart.monitor_and_restart(DELAY)`` first: the
process torchrun started only supervises a forked child, which runs the job and is forked again
when it dies (a replacement joins the running job).
``--backend nccl`` trains on the GPU of the rank's local rank, over NCCL (the GPU tests).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
import time
import weakref
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from resiliency import inprocess
from resiliency.goodput import get_recorder
from resiliency.inprocess._launcher_contract import REJOIN_FILE_ENV
from resiliency.inprocess.state import FrozenState

INITIAL_RANK = int(os.environ["RANK"])


def parse_faults(values: list[str]) -> dict[int, int]:
    out = {}
    for value in values:
        rank, _, at = value.partition("@")
        out[int(rank)] = int(at)
    return out


def params(model: torch.nn.Module) -> list[float]:
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out) / f"rank{INITIAL_RANK}.jsonl"
        torch.manual_seed(0)
        self.device = torch.device("cpu")
        if args.backend == "nccl":
            self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(self.device)
        self.model = torch.nn.Linear(4, 3).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=args.momentum)
        self.step = 0
        self.previous: list[weakref.ref] = []  # the last iteration's DDP model and group
        self.healer = (
            inprocess.Healer({"model": self.model, "optimizer": self.opt}, per_rank=self.per_rank)
            if args.heal
            else None
        )
        self.mid_update = parse_faults(args.raise_mid_update)
        self.raises = parse_faults(args.raise_)
        self.hangs = parse_faults(args.hang)
        self.masked = parse_faults(args.hang_masked)
        self.gil_hangs = parse_faults(args.hang_gil)
        self.stuck = parse_faults(args.stuck_in_except)
        self.kills = parse_faults(args.kill)
        self.sigterms = parse_faults(args.sigterm)
        self.value_errors = {
            int(rank): [int(n) for n in at.split(",")]
            for rank, _, at in (v.partition("@") for v in args.value_error)
        }

    def record(self, **fields: object) -> None:
        with self.out.open("a") as f:
            f.write(json.dumps({"rank": INITIAL_RANK, "pid": os.getpid(), **fields}) + "\n")

    def fault(self, iteration: int) -> None:
        steps = self.value_errors.get(INITIAL_RANK, [])
        at = steps[0] if len(steps) == 1 else steps[iteration] if iteration < len(steps) else None
        if at == self.step:
            raise ValueError(f"injected repeated fault on rank {INITIAL_RANK}")
        if iteration != 0:
            return
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and self.kills.get(INITIAL_RANK) == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        if first_attempt and self.sigterms.get(INITIAL_RANK) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
        if self.raises.get(INITIAL_RANK) == self.step:
            raise RuntimeError(f"injected fault on rank {INITIAL_RANK} at step {self.step}")
        if self.hangs.get(INITIAL_RANK) == self.step:
            ctypes.CDLL(None).sleep(600)
        if first_attempt and self.masked.get(INITIAL_RANK) == self.step:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN + 4})
            ctypes.CDLL(None).sleep(600)
        if first_attempt and self.stuck.get(INITIAL_RANK) == self.step:
            self.stuck_in_except()
        if first_attempt and self.gil_hangs.get(INITIAL_RANK) == self.step:
            ctypes.PyDLL(None).sleep(600)  # PyDLL: the GIL stays held during the call

    def stuck_in_except(self) -> None:
        """Hang until the restart request, catch it, and block in the handler for good."""
        libc = ctypes.CDLL(None)  # CDLL: the GIL is released, the monitor thread runs
        try:
            while True:  # a signal that raises nothing (the monitor's stack dump) ends a sleep
                libc.sleep(600)
        except inprocess.exception.RankShouldRestart:
            self.record(event="caught_restart", step=self.step)
            while True:  # the user's clean-up blocks: never back to the wrapper
                libc.sleep(600)

    def per_rank(self, result: inprocess.HealResult) -> None:
        # the per-rank values (the data) derive from the step in this job: nothing to restore
        self.record(event="per_rank", step=result.step)

    def forget(self) -> None:
        """Lose the state, as a new process would: other weights, no optimizer state."""
        with torch.no_grad():
            for p in self.model.parameters():
                p.uniform_(-5, 5)
        self.opt.state.clear()
        assert self.healer is not None
        self.healer.invalidate()

    def update(self, iteration: int) -> None:
        if iteration == 0 and self.mid_update.get(INITIAL_RANK) == self.step:
            with torch.no_grad():
                self.model.weight.add_(self.model.weight.grad, alpha=-0.1)
            raise RuntimeError(f"injected fault on rank {INITIAL_RANK} inside step {self.step}")
        self.opt.step()

    def train(self, call_wrapper: inprocess.CallWrapper | None = None) -> list[float]:
        assert call_wrapper is not None
        iteration = call_wrapper.iteration
        base = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
        # A store namespace per launcher attempt and wrapper iteration: after a full restart
        # the launcher's store still holds the previous attempt's keys.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"train/{attempt}/{iteration}", base)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            self.args.backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        if self.healer is not None:
            if iteration == 1 and INITIAL_RANK in self.args.forget:
                self.forget()
            result = self.healer.heal(call_wrapper=call_wrapper)
            self.step = result.step
            self.record(event="heal", iteration=iteration, **asdict(result))
        ddp = DistributedDataParallel(self.model)
        if self.args.check_freed:
            if iteration > 0:
                alive = [type(ref()).__name__ for ref in self.previous if ref() is not None]
                self.record(event="freed", iteration=iteration, alive=alive)
            self.previous = [weakref.ref(ddp), weakref.ref(dist.group.WORLD)]
        self.record(event="start", iteration=iteration, step=self.step, params=params(self.model))
        while self.step < self.args.steps:
            self.fault(iteration)
            g = torch.Generator().manual_seed(1000 * self.step + rank)
            x = torch.randn(8, 4, generator=g).to(self.device)
            self.opt.zero_grad(set_to_none=True)
            ddp(x).pow(2).mean().backward()
            if self.healer is not None:
                with self.healer.updating(self.step + 1):
                    self.update(iteration)
            else:
                self.opt.step()
            self.step += 1
            # rank 0's steps in the goodput ledger (a no-op without RESILIENCY_GOODPUT_DIR)
            get_recorder().step(self.step)
            self.record(event="step", iteration=iteration, step=self.step)
            self.record(event="params", step=self.step, params=params(self.model))
            if self.args.ping:
                call_wrapper.ping()
            time.sleep(self.args.step_time)
        dist.barrier()
        dist.destroy_process_group()
        return params(self.model)


class InitRaise(inprocess.initialize.Initialize):
    def __init__(self, faults: dict[int, int]) -> None:
        self.faults = faults

    def __call__(self, state: FrozenState) -> FrozenState:
        if self.faults.get(state.initial_rank) == state.iteration:
            raise RuntimeError(f"injected initialize fault at iteration {state.iteration}")
        return state


class Unhealthy(inprocess.health_check.HealthCheck):
    def __init__(self, ranks: set[int]) -> None:
        self.ranks = ranks

    def __call__(self, state: FrozenState) -> FrozenState:
        if state.initial_rank in self.ranks:
            raise RuntimeError(f"injected: rank {state.initial_rank}'s device is broken")
        return state


def tree(per_host: int) -> inprocess.rank_assignment.Tree:
    """One active rank per "host" of ``per_host`` consecutive ranks; spares replace within a
    host first, then across the job."""
    layer = inprocess.rank_assignment.Layer
    reserve = inprocess.rank_assignment.LayerFlag.RESERVE
    return inprocess.rank_assignment.Tree(
        [
            layer(key_or_fn="job", flag=reserve),
            layer(
                max_ranks=1, key_or_fn=lambda s: f"host{s.initial_rank // per_host}", flag=reserve
            ),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--raise", dest="raise_", action="append", default=[])
    parser.add_argument("--hang", action="append", default=[])
    parser.add_argument("--hang-masked", action="append", default=[])
    parser.add_argument("--stuck-in-except", action="append", default=[])
    parser.add_argument("--hang-gil", action="append", default=[])
    parser.add_argument("--init-raise", action="append", default=[])
    parser.add_argument("--unhealthy", type=int, action="append", default=[])
    parser.add_argument("--value-error", action="append", default=[])
    parser.add_argument("--ping", action="store_true")
    parser.add_argument("--kill", action="append", default=[])
    parser.add_argument("--sigterm", action="append", default=[])
    parser.add_argument("--respawn-delay", type=float, default=0.0)
    parser.add_argument("--max-repeated", type=int, default=3)
    parser.add_argument("--heal", action="store_true")
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--raise-mid-update", action="append", default=[])
    parser.add_argument("--forget", type=int, action="append", default=[])
    parser.add_argument("--soft", type=float, default=30.0)
    parser.add_argument("--hard", type=float, default=60.0)
    parser.add_argument("--check-freed", action="store_true")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--tree-hosts", type=int, default=0)
    parser.add_argument("--store-port", type=int, default=0)
    parser.add_argument("--log-info", action="store_true", help="log the wrapper's INFO lines")
    parser.add_argument("--rank-filter", type=int, default=0, help="NVRx's deprecated argument")
    parser.add_argument("--auto-restart", type=float, default=None, help="restart_delay")
    parser.add_argument("--heartbeat-timeout", type=float, default=20.0)
    args = parser.parse_args()
    if args.auto_restart is not None:
        inprocess.auto_restart.monitor_and_restart(restart_delay=args.auto_restart)
    if args.log_info:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    if os.environ.get(REJOIN_FILE_ENV):
        time.sleep(args.respawn_delay)  # a respawned process that is slow to join
    job = Job(args)
    wrapper = inprocess.Wrapper(
        initialize=InitRaise(parse_faults(args.init_raise)),
        health_check=Unhealthy(set(args.unhealthy)),
        monitor_thread_interval=timedelta(seconds=0.2),
        heartbeat_interval=timedelta(seconds=0.5),
        heartbeat_timeout=timedelta(seconds=args.heartbeat_timeout),
        soft_timeout=timedelta(seconds=args.soft),
        hard_timeout=timedelta(seconds=args.hard),
        barrier_timeout=timedelta(seconds=args.hard + 60),
        completion_timeout=timedelta(seconds=120),
        termination_grace_time=timedelta(seconds=2),
        max_repeated_faults=args.max_repeated or None,
        rank_assignment=tree(args.tree_hosts) if args.tree_hosts else None,
        store_kwargs={"port": args.store_port} if args.store_port else None,
        rank_filter=(
            inprocess.rank_filter.MaxActiveWorldSize(args.rank_filter) if args.rank_filter else None
        ),
    )
    final = wrapper(job.train)()
    job.record(event="done", step=job.step, params=final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
