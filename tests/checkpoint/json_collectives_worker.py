"""One rank of a 2-rank gloo job that exercises the JSON collectives and make_plan's exchange.

Usage: python rank_group.py 2 OUT DEADLINE_S 0 json_collectives_worker.py OUT
    rank_group.py forks the ranks (env:// variables); each writes its findings to
    ``OUT/rank<RANK>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from resiliency.checkpoint._collectives.json_exchange import (
    all_gather_json,
    gather_json,
    scatter_json,
)
from resiliency.checkpoint._dcp import planning as _dcp
from resiliency.checkpoint._dcp.plan_codec import encode_plan


def _value(rank: int) -> Any:
    # Different lengths per rank (gather and scatter pad), non-ASCII text, every JSON type.
    return {"rank": rank, "text": "é✓" * (50 * rank + 1), "list": [1, 2.5, None, True, "x"]}


def _collectives(rank: int, world: int, group: dist.ProcessGroup) -> dict[str, Any]:
    out: dict[str, Any] = {
        "all_gather": all_gather_json(_value(rank), group),
        "gather_to_0": gather_json(_value(rank), 0, group),
        "gather_to_1": gather_json(_value(rank), 1, group),
    }
    for src in range(world):
        values = [{"to": r, "from": src, "pad": "z" * 100 * r} for r in range(world)]
        out[f"scatter_from_{src}"] = scatter_json(values if rank == src else None, src, group)
    failures: dict[str, str] = {}
    attempts = {
        "gather_bad_on_1": lambda: gather_json(object() if rank == 1 else 1, 0, group),
        "all_gather_bad_on_0": lambda: all_gather_json({1} if rank == 0 else 1, group),
        "scatter_bad_value": lambda: scatter_json([1, {2}] if rank == 0 else None, 0, group),
        "scatter_too_few": lambda: scatter_json([1] if rank == 1 else None, 1, group),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            failures[name] = ""
        except ValueError as exc:
            failures[name] = str(exc)
    out["failures"] = failures
    out["after_failures"] = all_gather_json(rank, group)  # the group is still in step
    return out


def _state() -> dict[str, Any]:
    torch.manual_seed(0)  # the same on every rank, as DDP replicas are
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"n": 1, "l": [2]}}


def _expected(rank: int, world: int, path: str) -> tuple[Any, Any]:
    """What DCP's own planning yields for this rank, computed in one process without transport."""
    planners = []
    for r in range(world):
        planner = DefaultSavePlanner()
        planner.set_up_planner(_state(), storage_meta=None, is_coordinator=r == 0)
        planners.append(planner)
    central, metadata = planners[0].create_global_plan([p.create_local_plan() for p in planners])
    central = FileSystemWriter(path).prepare_global_plan(central)
    return planners[rank].finish_plan(central[rank]), metadata


def _outcome(result: tuple[Any, dict[str, Any]]) -> list[Any]:
    plan, decision = result
    return [plan is None, decision]


def _make_plan(rank: int, world: int, group: dist.ProcessGroup, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cache = _dcp.PlanCache()
    plan, decision = _dcp.make_plan(
        _state(), group, {"path": path}, lambda: {"nonce": 7}, cache=cache
    )
    assert plan is not None, decision
    expected, metadata = _expected(rank, world, path)
    out["decision"] = decision
    out["prefix"] = plan.prefix
    out["same_as_dcp"] = encode_plan(plan.plan) == encode_plan(expected)
    out["metadata_same_as_dcp"] = plan.metadata == metadata if rank == 0 else None
    again, decision = _dcp.make_plan(
        _state(), group, {"path": path}, lambda: {"nonce": 8}, cache=cache
    )
    out["cache_hit"] = again is not None and again.plan is plan.plan and decision == {"nonce": 8}

    duplicate = {"a.b": 1, "a": {"b": 2}}  # flattening refuses two values named "a.b"
    state = duplicate if rank == 1 else _state()
    out["setup_fails_on_1"] = _outcome(
        _dcp.make_plan(state, group, {"path": path}, lambda: {"nonce": 1})
    )

    def refuse() -> dict[str, Any]:
        raise OSError("no tmp dir")

    out["decide_fails"] = _outcome(_dcp.make_plan(_state(), group, {"path": path}, refuse))
    out["decide_not_json"] = _outcome(
        _dcp.make_plan(_state(), group, {"path": path}, lambda: {"nonce": 2, "x": object()})
    )
    out["decide_error"] = _outcome(
        _dcp.make_plan(_state(), group, {"path": path}, lambda: {"error": "no"})
    )
    return out


def main() -> int:
    rank, world, out = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), Path(sys.argv[1])
    # env:// from rank_group; a hang fails the job instead of stalling the test.
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    group = dist.new_group(list(range(world)), backend="gloo")
    with tempfile.TemporaryDirectory() as path:
        result = {"collectives": _collectives(rank, world, group)}
        result["make_plan"] = _make_plan(rank, world, group, path)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
