"""Straggler detection in a toy training loop where the rank chosen with --slow-rank slows down.

Single process (no torch needed):
    python examples/straggler_basic.py --steps 60
Four ranks on CPU (gloo):
    torchrun --nproc-per-node 4 examples/straggler_basic.py --slow-rank 2 --heatmap heatmap.png
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from resiliency.straggler import Detector, append_report, load_reports, render_heatmap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.01)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--report-interval", type=float, default=0.3)
    parser.add_argument("--history", type=Path, default=Path("straggler_history.jsonl"))
    parser.add_argument("--heatmap", type=Path, help="render the history to this PNG at the end")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    rank = int(os.environ.get("RANK", "0"))
    if "WORLD_SIZE" in os.environ:  # started by torchrun; torch is needed only then
        import torch.distributed as dist  # noqa: PLC0415

        dist.init_process_group("gloo")
    Detector.initialize(report_time_interval=args.report_interval)
    if rank == 0:
        args.history.unlink(missing_ok=True)

    for step in range(args.steps):
        slow = 2.0 if rank == args.slow_rank and step >= args.steps // 3 else 1.0
        with Detector.detection_section("data", profile_cuda=False):
            time.sleep(args.step_time / 4)
        with Detector.detection_section("step"):
            time.sleep(args.step_time * slow)
        report = Detector.generate_report_if_interval_elapsed()
        if report is not None and rank == 0:
            append_report(args.history, report)
            found = report.identify_stragglers()["straggler_sections_relative"]
            print(f"step {step}: stragglers {dict(found) or 'none'}")

    Detector.shutdown()
    if rank == 0 and args.heatmap is not None:
        size = render_heatmap(load_reports(args.history), args.heatmap)
        print(f"heatmap {size[0]}x{size[1]} written to {args.heatmap}")


if __name__ == "__main__":
    main()
