"""Object-store checkpoint scenarios on real gloo ranks, one process per rank.

Usage: python rank_group.py WORLD OUT DEADLINE_S CODES remote_worker.py WORLD URL SCENARIO OUT
           [--steps N] [--step S] [--keep K]
    rank_group.py (torch-free) starts WORLD ranks of this script and waits for them; each rank
    writes OUT/rank<r>.json (its findings) and logs into OUT/rank<r>.log.

Each rank's state has a tensor of its own (``shard<r>``, so every rank writes a data file) and
one every rank shares (``shared``, written once by DCP's dedup); the values encode the step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from resiliency.checkpoint import CheckpointManager

ELEMENTS = 64 << 10


def _state(rank: int, step: int) -> dict[str, Any]:
    base = torch.arange(ELEMENTS, dtype=torch.float32)
    return {
        f"shard{rank}": base + step * 1000 + rank * 100,
        "shared": base * 2 + step,
        "meta": {"step": step},  # the same on every rank: DCP writes it once
    }


def _matches(state: dict[str, Any], rank: int, step: int) -> bool:
    want = _state(rank, step)
    return (
        torch.equal(state[f"shard{rank}"], want[f"shard{rank}"])
        and torch.equal(state["shared"], want["shared"])
        and state["meta"] == want["meta"]
    )


def _blank(rank: int) -> dict[str, Any]:
    empty = _state(rank, 0)
    return {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else {"step": -1}
        for k, v in empty.items()
    }


def _rank(args: argparse.Namespace) -> dict[str, Any]:
    rank = dist.get_rank()
    found: dict[str, Any] = {"rank": rank}
    if args.scenario == "save":
        with CheckpointManager(args.url, keep_last=args.keep, writer_timeout_s=60) as mgr:
            for step in range(1, args.steps + 1):
                mgr.save(step, _state(rank, step))
            mgr.wait()
            found["steps"] = mgr.steps()
    elif args.scenario == "load":
        state = _blank(rank)
        mgr = CheckpointManager(args.url, keep_last=None, writer_timeout_s=60)
        try:
            loaded = mgr.load(state, step=args.step)
            found["loaded"] = loaded
            found["identical"] = loaded is not None and _matches(state, rank, loaded)
            if loaded is not None:  # the same step through DCP's own fsspec reader
                plain = _blank(rank)
                dcp.load(plain, checkpoint_id=f"{args.url}/step_{loaded:09d}")
                found["dcp_identical"] = _matches(plain, rank, loaded)
        except Exception as exc:
            found["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            mgr.close()
    elif args.scenario == "die_mid_save":
        mgr = CheckpointManager(args.url, keep_last=None, writer_timeout_s=60)
        mgr.save(1, _state(rank, 1)).wait()
        handle = mgr.save(2, _state(rank, 2))
        if rank == 1:
            os._exit(17)  # the node dies with its save in flight
        try:
            handle.wait()
            found["error"] = ""
        except Exception as exc:
            found["error"] = f"{type(exc).__name__}: {exc}"
    else:
        raise SystemExit(f"unknown scenario {args.scenario!r}")
    return found


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("world", type=int)
    p.add_argument("url")
    p.add_argument("scenario")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--keep", type=int, default=None)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {rank}] %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    found = _rank(args)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(found))
    logging.shutdown()
    sys.stdout.flush()
    # No destroy_process_group: a rank of die_mid_save has lost its peer, and every rank is done.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
