"""One rank of test_collective_wait.py: DDP on gloo, one rank slowed inside its backward pass.

Usage: python _ddp_worker.py RANK WORLD PORT OUT_DIR SLOW_RANK DELAY_S
Every rank's backward pass takes BASE_S of its own; the slow rank's takes DELAY_S more.
Rank 0 writes the report's relative section scores and stragglers to OUT_DIR/report.json.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from resiliency.straggler import CollectiveWait, Detector

STEPS = 12
BASE_S = 0.1  # every rank's own work per step: scores compare real work, not clock noise


class _SlowBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps (a rank slow in its own computation)."""

    delay_s = 0.0

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(_SlowBackward.delay_s)
        return grad


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the slow rank's gradients of `first` are ready only after the sleep
        return self.second(_SlowBackward.apply(self.first(x)))


def main() -> int:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    out, slow, delay = Path(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    torch.manual_seed(0)
    ddp = DistributedDataParallel(_Net())
    wait = CollectiveWait(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    _SlowBackward.delay_s = BASE_S + (delay if rank == slow else 0.0)
    Detector.initialize(scores_to_compute=["relative_perf_scores"], gather_on_rank0=True)
    net = wait.section("step net of all-reduce wait")
    for step in range(STEPS):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * world + rank))
        with Detector.detection_section("step", profile_cuda=False), net:
            opt.zero_grad()
            ddp(x).sum().backward()
            opt.step()
    report = Detector.generate_report()
    if rank == 0:
        assert report is not None
        stragglers = report.identify_stragglers()["straggler_sections_relative"]
        (out / "report.json").write_text(
            json.dumps(
                {
                    "scores": report.section_relative_perf_scores,
                    "stragglers": {k: sorted(s.rank for s in v) for k, v in stragglers.items()},
                    "blocked_s": wait.blocked_ns / 1e9,
                }
            )
        )
    Detector.shutdown()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
