"""Checkpoint save cost, side by side: torch.save, DCP save, DCP async_save, ours, a plain copy.

    python benchmarks/bench_checkpoint.py                      # 2 gloo ranks, ~1 GiB state each
    python benchmarks/bench_checkpoint.py --size-gib 0.25 --repeats 2 --ours-saves 4   # quick
    python benchmarks/bench_checkpoint.py --json results.json
    python benchmarks/bench_checkpoint.py --device cuda --world 1   # GPU state, one GPU

Each rank holds the same DDP-style model and AdamW state (parameters + two moments, ``--size-gib``
in total per rank) and saves it with every method, one method after the other, in one run:

- ``torch.save``: synchronous, one file per rank; durable after an fsync;
- ``dcp.save``: synchronous DCP (replicated tensors deduplicated: each rank writes about half);
- ``dcp.async_save`` with ``AsyncCheckpointerType.THREAD`` and ``.PROCESS`` (DCP's stager
  copies the whole state before planning; the first PROCESS save, which spawns, is a warm-up);
- ``ours``: ``CheckpointManager.save`` (plans, then copies only this rank's share);
- ``copy (share)`` / ``copy (full)``: ``copy_`` of the tensors this rank writes (its DCP share),
  or of the whole state, into buffers allocated beforehand: the physical limit of blocking.
  With ``--device cuda`` the buffers are pinned host memory (asynchronous copies, one
  synchronization); ``copy (pageable)`` copies into ordinary host memory instead, which is what
  staging costs without pinning.

Per method: time the loop is blocked per save (median over ``--repeats`` saves after one
warm-up, slowest rank), time until the step is durable, and peak extra memory: the PSS
(proportional set size: shared pages counted once) of the rank and its helper processes, above
its level before the method's first save. Then the PSS after each of ``--ours-saves`` saves of
ours (flat when staging is allocated once). Rank 0 prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from resiliency.checkpoint import CheckpointManager


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in map(int, children):
        out.append(child)
        out.extend(_descendants(child))
    return out


def pss_mib() -> float:
    """PSS of this process and all its descendants, in MiB."""
    me = os.getpid()
    return sum(_pss_kib(p) for p in [me, *_descendants(me)]) / 1024


class PeakSampler:
    """Sample PSS in a thread; ``peak`` is the highest value seen."""

    def __init__(self, interval: float = 0.02) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, pss_mib())
            self._stop.wait(interval)

    def __enter__(self) -> PeakSampler:
        self.peak = pss_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, pss_mib())


def make_state(size_gib: float, device: str = "cpu") -> dict[str, Any]:
    """A model's parameters and AdamW moments (3 x 4 bytes per parameter), 64 tensors."""
    per_tensor = int(size_gib * (1 << 30) / 12 / 64)
    torch.manual_seed(0)
    params = {f"layer{i}.weight": torch.randn(per_tensor, device=device) for i in range(64)}
    optim = {
        f"layer{i}.weight": {
            "step": torch.tensor(10.0),
            "exp_avg": torch.randn(per_tensor, device=device),
            "exp_avg_sq": torch.rand(per_tensor, device=device),
        }
        for i in range(64)
    }
    return {"model": params, "optim": {"state": optim, "lr": 1e-3}}


def tensors_of(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_of(v)]
    return []


def fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def run_method(name: str, state: dict[str, Any], work: Path, repeats: int, rank: int) -> dict:
    """Warm-up + ``repeats`` saves; blocked and durable seconds per save, peak extra PSS."""
    blocked, total = [], []
    mgr = CheckpointManager(work / "ours", keep_last=1) if name == "ours" else None
    share: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    if name.startswith("copy"):
        if name == "copy (share)":
            # the tensors this rank writes: DCP's dedup gives each rank about half
            from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: PLC0415

            planner = DefaultSavePlanner()
            planner.set_up_planner(state, None, rank == 0)
            plans, _ = planner.create_global_plan(
                [_plan_of(state, r) for r in range(dist.get_world_size())]
            )
            share = [planner.lookup_object(i.index) for i in plans[rank].items if i.tensor_data]
        else:
            share = tensors_of(state)
        # a GPU tensor is copied to the host: pinned buffers unless the method says pageable
        buffers = [
            torch.empty(t.shape, dtype=t.dtype, pin_memory=name != "copy (pageable)")
            if t.is_cuda
            else torch.empty_like(t)
            for t in share
        ]
    cuda = any(t.is_cuda for t in tensors_of(state))
    dist.barrier()
    base = pss_mib()
    with PeakSampler() as sampler:
        for i in range(repeats + 1):
            target = work / f"{name.replace(' ', '_')}_{i}"
            dist.barrier()
            t0 = time.perf_counter()
            if name == "torch.save":
                target.mkdir(parents=True, exist_ok=True)
                torch.save(state, target / f"rank{rank}.pt")
                t1 = time.perf_counter()
                fsync_tree(target / f"rank{rank}.pt")
            elif name == "dcp.save":
                dcp.save(state, checkpoint_id=str(target))
                t1 = time.perf_counter()
            elif name.startswith("dcp.async_save"):
                kind = (
                    AsyncCheckpointerType.PROCESS
                    if "process" in name
                    else AsyncCheckpointerType.THREAD
                )
                future = dcp.async_save(
                    state, checkpoint_id=str(target), async_checkpointer_type=kind
                )
                t1 = time.perf_counter()
                future.result()
            elif name == "ours":
                assert mgr is not None
                handle = mgr.save(i + 1, state)
                t1 = time.perf_counter()
                handle.wait()
            else:
                for dst, src in zip(buffers, share, strict=True):
                    dst.copy_(src, non_blocking=src.is_cuda and dst.is_pinned())
                if cuda:
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
            t2 = time.perf_counter()
            if i > 0:  # the first save is a warm-up (spawns, first-touch of buffers)
                blocked.append(t1 - t0)
                total.append(t2 - t0)
            dist.barrier()
            if target.exists() and rank == 0:
                shutil.rmtree(target, ignore_errors=True)
    if mgr is not None:
        mgr.close()
    dist.barrier()
    return {
        "blocked_s": statistics.median(blocked),
        "total_s": statistics.median(total),
        "peak_extra_mib": sampler.peak - base,
        "bytes": sum(t.numel() * t.element_size() for t in share) if share else None,
    }


def _plan_of(state: dict[str, Any], rank: int) -> Any:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: PLC0415

    planner = DefaultSavePlanner()
    planner.set_up_planner(state, None, rank == 0)
    return planner.create_local_plan()


def ours_rss_series(state: dict[str, Any], work: Path, saves: int) -> list[float]:
    """PSS (MiB, rank + writer) after each of ``saves`` saves of ours."""
    series = []
    with CheckpointManager(work / "ours_series", keep_last=1) as mgr:
        for step in range(1, saves + 1):
            mgr.save(step, state).wait()
            series.append(round(pss_mib(), 1))
    return series


METHODS = [
    "copy (full)",
    "copy (pageable)",
    "copy (share)",
    "ours",
    "dcp.async_save thread",
    "dcp.async_save process",
    "dcp.save",
    "torch.save",
]


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, work: Path) -> None:
    # One intra-op thread per rank: ranks x threads = the cores of a 2-core machine; more
    # threads only spin against each other (every method gets the same setting).
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    state = make_state(args.size_gib, args.device)
    size = sum(t.numel() * t.element_size() for t in tensors_of(state))
    results: dict[str, Any] = {}
    for name in args.methods:
        results[name] = run_method(name, state, work, args.repeats, rank)
        if rank == 0:
            print(f"  {name}: {results[name]}", flush=True)
    series = ours_rss_series(state, work, args.ours_saves)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"results": results, "series": series, "size": size})
    if rank == 0:
        report(gathered, args)
    dist.barrier()
    dist.destroy_process_group()


def report(gathered: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rows = {}
    for name in args.methods:
        per_rank = [g["results"][name] for g in gathered]
        rows[name] = {
            "blocked_s": max(r["blocked_s"] for r in per_rank),
            "total_s": max(r["total_s"] for r in per_rank),
            "peak_extra_mib": max(r["peak_extra_mib"] for r in per_rank),
        }
    size_mib = gathered[0]["size"] / (1 << 20)
    print(
        f"\nstate per rank: {size_mib:.0f} MiB on {args.device}; {len(gathered)} gloo ranks; "
        f"median of "
        f"{args.repeats} saves after a warm-up; slowest rank"
    )
    print(f"{'method':<24}{'blocked s':>11}{'durable s':>11}{'peak extra MiB':>16}")
    for name, r in rows.items():
        print(f"{name:<24}{r['blocked_s']:>11.3f}{r['total_s']:>11.3f}{r['peak_extra_mib']:>16.0f}")
    ours, copy_share = rows.get("ours"), rows.get("copy (share)")
    dcp_async = [rows[n]["blocked_s"] for n in rows if n.startswith("dcp.async_save")]
    if ours and copy_share:
        print(
            f"\nours blocked / copy (share) = {ours['blocked_s'] / copy_share['blocked_s']:.2f}x "
            "(target <= 1.3x)"
        )
    if ours and dcp_async:
        print(
            f"ours blocked / best DCP async_save = {ours['blocked_s'] / min(dcp_async):.2f}x "
            "(target <= 1x)"
        )
    for rank, g in enumerate(gathered):
        print(f"rank {rank} PSS after each of our saves (MiB): {g['series']}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "size_mib": size_mib,
                    "device": args.device,
                    "rows": rows,
                    "ours_pss_series": [g["series"] for g in gathered],
                },
                indent=2,
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ours-saves", type=int, default=10)
    parser.add_argument(
        "--methods", nargs="*", default=None, help="default: all (copy (pageable) on cuda only)"
    )
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the state lives"
    )
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.methods is None:
        args.methods = [m for m in METHODS if args.device == "cuda" or m != "copy (pageable)"]
    if args.rank is not None:
        rank_main(args.rank, args.world, args.port, args, Path(args.dir))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, __file__, *sys.argv[1:], "--dir", str(work), "--port", str(port)]
    procs = [subprocess.Popen([*argv, "--rank", str(r)]) for r in range(args.world)]
    try:
        codes = [p.wait(timeout=3600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return max(abs(c) for c in codes)


if __name__ == "__main__":
    sys.exit(main())
