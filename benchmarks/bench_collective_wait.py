"""Cost of timing the all-reduce wait (CollectiveWait) against DDP's built-in all-reduce.

Two gloo ranks train the same DDP model; each run alternates rounds with DDP's own all-reduce
and rounds with the CollectiveWait hook plus one net-of-wait section per step, and prints the
median step time of each and the difference per step.

    python benchmarks/bench_collective_wait.py [--rounds 7] [--steps 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from resiliency.straggler import CollectiveWait, Detector


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(512, 512) for _ in range(4)))  # ~1M params


def _round(ddp: DistributedDataParallel, steps: int, section: object | None) -> float:
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(32, 512)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        if section is None:
            opt.zero_grad()
            ddp(x).sum().backward()
            opt.step()
        else:
            with section:  # type: ignore[attr-defined]
                opt.zero_grad()
                ddp(x).sum().backward()
                opt.step()
    return (time.perf_counter() - start) / steps


def rank_main(rank: int, port: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=300),
    )
    plain = DistributedDataParallel(_model())
    timed = DistributedDataParallel(_model())
    Detector.initialize(scores_to_compute=["relative_perf_scores"])
    section = CollectiveWait(timed).section("step net of all-reduce wait")
    _round(plain, 5, None)
    _round(timed, 5, section)
    off, on = [], []
    for i in range(args.rounds):
        pair = [(plain, None, off), (timed, section, on)]
        for ddp, sec, out in pair if i % 2 == 0 else reversed(pair):
            out.append(_round(ddp, args.steps, sec))
    Detector.shutdown()
    if rank == 0:
        result = {
            "step_ms_builtin": statistics.median(off) * 1e3,
            "step_ms_collective_wait": statistics.median(on) * 1e3,
        }
        result["overhead_us_per_step"] = (
            result["step_ms_collective_wait"] - result["step_ms_builtin"]
        ) * 1e3
        print(
            f"2 gloo ranks, ~1M-parameter DDP model, median of {args.rounds} rounds of "
            f"{args.steps} steps:\n  DDP built-in all-reduce: {result['step_ms_builtin']:.2f} "
            f"ms/step\n  CollectiveWait hook + net section: "
            f"{result['step_ms_collective_wait']:.2f} ms/step\n  difference: "
            f"{result['overhead_us_per_step']:+.0f} us/step"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args)
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, __file__, *sys.argv[1:], "--port", str(port)]
    procs = [subprocess.Popen([*argv, "--rank", str(r)]) for r in range(2)]
    try:
        codes = [p.wait(timeout=1800) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return max(abs(c) for c in codes)


if __name__ == "__main__":
    sys.exit(main())
