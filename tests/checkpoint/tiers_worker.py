"""One rank of a tiered-checkpoint job (plain env:// start, or under ft-launcher).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK (torchelastic's node rank,
or set by the test), TIER_LOCAL_DIR (this node's local tier), TIER_OUT (results).

Usage: python tiers_worker.py PERSISTENT_DIR STEPS [--kill-in-replication STEP] [--local-every N]
       [--persistent-every M]

Restores from the tiers (newest assemblable step), trains to STEPS saving on both tiers, and
writes ``TIER_OUT/job-<tag>-rank<r>.json``: what was restored (step, tier, and whether the state
is bit-identical to the digest recorded when that step was saved) and the digests it saved
(``TIER_OUT/digest-shard<r>-step<N>.txt``, keyed by the global rank = shard identity).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from resiliency.checkpoint import AppState, CheckpointManager, LocalTier, PersistentTier
from resiliency.checkpoint._tiers import replicate as _replicate
from resiliency.goodput import get_recorder


def digest(model: torch.nn.Module, opt: torch.optim.Optimizer, app: AppState) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    for k, s in sorted(opt.state_dict()["state"].items()):
        for n, x in sorted(s.items()):
            h.update(f"{k}.{n}".encode())
            h.update(x.numpy().tobytes() if torch.is_tensor(x) else repr(x).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    h.update(repr(random.getstate()).encode())
    h.update(np.random.get_state()[1].tobytes())
    h.update(json.dumps(app.extra["sampler"]).encode())
    return h.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("persistent")
    p.add_argument("steps", type=int)
    p.add_argument("--kill-in-replication", type=int, default=-1)
    p.add_argument("--kill-node", type=int, default=1)
    p.add_argument("--stall-in-replication", type=int, default=-1)
    p.add_argument("--repl-timeout", type=float, default=30.0)
    p.add_argument("--local-every", type=int, default=1)
    p.add_argument("--persistent-every", type=int, default=5)
    p.add_argument("--tag", default="job")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    node = int(os.environ["GROUP_RANK"])
    out = Path(os.environ["TIER_OUT"])
    local_dir = os.environ["TIER_LOCAL_DIR"]
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {rank} node {node}] %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    (out / f"pid-{rank}-{os.getpid()}").touch()
    (out / f"place-{args.tag}-p{os.getpid()}-g{node}-{Path(local_dir).name}").touch()
    _replicate.CHUNK_BYTES = 64 << 10  # several chunks per shard: a kill lands mid-transfer
    if args.kill_in_replication >= 0 and node == args.kill_node and attempt == 0:
        real_wait = _replicate._Link.wait
        rounds = {"n": 0}

        def wait(self: Any, *a: Any) -> None:
            if f"step {args.kill_in_replication} " in self.what:
                rounds["n"] += 1
                if rounds["n"] == 4:  # headers done, chunks on their way
                    (out / f"killed-{rank}").touch()
                    os.kill(os.getpid(), signal.SIGKILL)
            real_wait(self, *a)

        _replicate._Link.wait = wait  # type: ignore[method-assign]

    if args.stall_in_replication >= 0 and node == args.kill_node:
        real_send = _replicate._Link.send
        stalled: set[str] = set()

        def send(self: Any, *a: Any) -> None:
            # A slow peer, not a dead one: past the others' deadline once, then it goes on.
            if f"step {args.stall_in_replication} " in self.what and self.what not in stalled:
                stalled.add(self.what)
                (out / f"stalled-{rank}").touch()
                time.sleep(args.repl_timeout + 2)
            real_send(self, *a)

        _replicate._Link.send = send  # type: ignore[method-assign]

    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    app = AppState(model, opt, sampler={"position": 0})
    torch.manual_seed(100 + rank)
    random.seed(200 + rank)
    np.random.seed(300 + rank)
    mgr = CheckpointManager(
        None,
        tiers=[
            LocalTier(local_dir, every=args.local_every, replicas=1, timeout_s=args.repl_timeout),
            PersistentTier(args.persistent, every=args.persistent_every, keep_last=3),
        ],
        writer_timeout_s=60,
    )
    result: dict[str, Any] = {
        "rank": rank,
        "node": node,
        "local_dir": local_dir,
        "attempt": attempt,
    }
    t0 = time.monotonic()
    restored = mgr.load({"app": app})
    result["restore_s"] = time.monotonic() - t0
    result["restored"] = restored
    if restored is not None:
        want = (out / f"digest-shard{rank}-step{restored}.txt").read_text()
        result["identical"] = digest(model.module, opt, app) == want
    start = restored or 0
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, 64)
        loss = model(x).pow(2).mean() + 0 * random.random() + 0 * float(np.random.rand())
        opt.zero_grad()
        loss.backward()
        opt.step()
        app.extra["sampler"] = {"position": app.extra["sampler"]["position"] + 16}
        (out / f"digest-shard{rank}-step{step}.txt").write_text(digest(model.module, opt, app))
        mgr.save(step, {"app": app})
    mgr.wait()
    result["steps"] = mgr.steps()
    mgr.close()
    get_recorder().flush()
    (out / f"{args.tag}-rank{rank}.json").write_text(json.dumps(result))
    # Free the DDP model before the process group: a gloo group whose last reference its
    # reducer drops is destroyed with the GIL held and can deadlock (pytorch/pytorch#56297).
    del model, app
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
