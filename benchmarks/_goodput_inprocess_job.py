"""The goodput benchmark's job with in-process restart: the Lightning job's twin as a plain loop.

    --setup inprocess   (the only setup; the flag keeps the command line of the other job)

The model, data, batch size, optimizer, fixed step time and checkpoint cadences are those of
``_goodput_job.py``; the training function runs inside ``resiliency.inprocess.Wrapper`` under
``ft-launcher --ft-inprocess-respawn``:

* a rank that dies of a signal is respawned alone by the launcher and healed from a live peer
  by ``inprocess.Healer`` (no step lost, the other processes stay);
* the ranks' heartbeats go to ft-launcher's rank monitors, so a stopped (SIGSTOP) rank is found
  and killed as hung, which the launcher answers with the full restart of the group; the
  heartbeat timeouts are calculated once the job has restarted (``_goodput_inprocess_timeouts``),
  as the toolkit's Lightning callback does;
* a full restart (preemption, node loss, a hang) resumes from the newest checkpoint file any
  rank can read (``_goodput_inprocess_ckpt.py``: blocking saves, node-local every
  ``--local-every`` steps, persistent every ``--persistent-every``), sent to the other ranks by
  the same heal.

A plain loop, not Lightning: ``Trainer.fit`` cannot resume at a step held in memory (only from
a checkpoint file), and a ``RankShouldRestart`` raised inside it runs Lightning's own exception
teardown (callbacks, strategy) before the Wrapper gets it; see docs/simulator.md.

The stores: the Wrapper's and each iteration's process group store are clients of the
launchers' rendezvous store (``--store``), which outlives every worker, so rank 0 can be
respawned alone too. ``MASTER_PORT`` (a fresh port per rendezvous round) names the round. The
Wrapper keeps its store's port open when it aborts, so the process group's store client (same
port) stays open too: an ``init_process_group`` waiting for a dead peer ends at
``STORE_TIMEOUT``, not at once, and that must come before the Wrapper's hard timeout.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _goodput_inprocess_ckpt import PlainCheckpoints
from _goodput_inprocess_timeouts import CalculatedTimeouts
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from resiliency import inprocess
from resiliency.ft import RankMonitorClient
from resiliency.goodput import get_recorder

BATCH = 8
# Below the Wrapper's hard_timeout - soft_timeout (15 s): the process group's store client is
# not shut down by the abort (see the module docstring), so an init_process_group that waits for
# a peer that died must end by its store timeout before the Wrapper gives up on the rank (seen
# with 20 s: a rank SIGKILLed while the others formed the group had them all terminated).
STORE_TIMEOUT = timedelta(seconds=10)


class _PortedPrefixStore(dist.PrefixStore):
    """A ``PrefixStore`` that names its server's port: the Wrapper keeps connections to that
    port open when it aborts (its own store's), and shuts down every other new socket."""

    def __init__(self, prefix: str, store: dist.TCPStore) -> None:
        super().__init__(prefix, store)
        self.port = store.port


def _model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))


def _batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch Lightning's DistributedSampler (no shuffle) gives ``rank`` at ``step``."""
    xs = []
    for j in range(BATCH):
        g = torch.Generator().manual_seed((step * BATCH + j) * world + rank)
        xs.append(torch.randn(16, generator=g))
    x = torch.stack(xs)
    return x, x.sum(1, keepdim=True)


class _Job:
    """What survives an in-process restart: the model, the optimizer, the healer, the client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        torch.manual_seed(0)
        self.model = _model(args.width)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        # Step 0 is every fresh process's state (the same seed): a consistent state to agree on.
        self.healer = inprocess.Healer({"model": self.model, "opt": self.opt}, step=0)
        self.ckpt = PlainCheckpoints(
            self.model,
            self.opt,
            args.local_dir,
            args.ckpt_dir,
            args.local_every,
            args.persistent_every,
        )
        self._call: inprocess.CallWrapper | None = None
        self.host, port = args.store.rsplit(":", 1)
        self.port = int(port)
        # The round's name: every rank of one rendezvous round has the same MASTER_PORT.
        self.round = os.environ["MASTER_PORT"]
        # Outside the wrapped function: the abort shuts down sockets the function opened.
        self.monitor = RankMonitorClient()
        self.monitor.init_workload_monitoring()
        self.timeouts = CalculatedTimeouts(self.monitor, args.ckpt_dir.parent / "ft_state.json")

    def _client(self) -> dist.TCPStore:
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=STORE_TIMEOUT)

    def wrapper_store(self, **_: Any) -> dist.Store:
        """The Wrapper's store: the rendezvous store, namespaced by the round."""
        return _PortedPrefixStore(f"bench/wrapper/{self.round}/", self._client())

    def _start_step(self, iteration: int) -> int:
        """The step every rank resumes at (a collective): each rank of a fresh start of the
        group (iteration 0) loads its newest readable checkpoint first; then the healer agrees
        on the newest step some rank holds and sends it to the others."""
        if iteration == 0:
            loaded = self.ckpt.load_newest(self.healer)
            step = self.healer.heal(call_wrapper=self._call).step
            if loaded is not None or step > 0:
                get_recorder().emit(
                    "checkpoint_loaded",
                    step=step,
                    tier=loaded or "peer",
                    bytes=0,
                    duration_s=time.monotonic() - self.ckpt.load_t0,
                )
            return step
        return self.healer.heal(call_wrapper=self._call).step

    def train(self, call_wrapper: inprocess.CallWrapper | None = None) -> None:
        """One call of the wrapped function: a new process group, heal, train."""
        assert call_wrapper is not None  # the Wrapper always passes it
        self._call = call_wrapper
        a, it = self.args, call_wrapper.iteration
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.PrefixStore(f"bench/pg/{self.round}/{it}/", self._client())
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=a.gloo_timeout),
        )
        step = self._start_step(it)
        self.timeouts.started(it, step)
        ddp = DistributedDataParallel(self.model)
        rec = get_recorder()
        while step < a.steps:
            x, y = _batch(step, rank, world)
            self.opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(ddp(x), y).backward()
            time.sleep(a.step_time)  # a fixed step time, whatever the machine does
            with self.healer.updating(step + 1):
                self.opt.step()
            step += 1
            rec.step(step)
            self.monitor.send_heartbeat()
            if self.ckpt.save_due(step, rank):
                self.timeouts.at_save(rank)
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setup", choices=["inprocess"], required=True)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--local-dir", type=Path, required=True)
    p.add_argument("--store", required=True, help="HOST:PORT of the launchers' rendezvous store")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--persistent-every", type=int, default=50)
    p.add_argument("--local-every", type=int, default=10)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--gloo-timeout", type=float, default=60.0)
    p.add_argument("--soft-timeout", type=float, default=30.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    # the Wrapper's restart lines (warnings), in the rank's log as they were before it asked
    # for a configured logging
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    job = _Job(args)
    wrapper = inprocess.Wrapper(
        store_factory=job.wrapper_store,
        monitor_thread_interval=timedelta(seconds=0.5),
        heartbeat_interval=timedelta(seconds=1),
        # Long enough that a lost node's ranks are replaced by the launchers' full restart
        # (the node comes back within seconds) before the survivors would go on without them.
        heartbeat_timeout=timedelta(seconds=60),
        soft_timeout=timedelta(seconds=args.soft_timeout),
        hard_timeout=timedelta(seconds=args.soft_timeout + 15),
        barrier_timeout=timedelta(seconds=120),
        completion_timeout=timedelta(seconds=120),
        termination_grace_time=timedelta(seconds=2),
        max_repeated_faults=None,
    )
    wrapper(job.train)()


if __name__ == "__main__":
    main()
