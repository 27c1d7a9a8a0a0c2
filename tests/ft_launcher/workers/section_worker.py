"""A gloo rank that all-reduces inside a ``step`` section; --hang-rank sleeps outside any section.

The ranks that wait for it are the ones whose section timer expires; the sleeper's monitor sees
nothing wrong (no section open, no heartbeat timeout). Marker files: start-<rank>-<attempt>-<pid>,
hang-<rank>-<attempt>.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from resiliency.ft import RankMonitorClient

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def asleep_outside_any_section(marker_dir: Path) -> None:
    (marker_dir / f"hang-{RANK}-{ATTEMPT}").write_text("")
    time.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker-dir", type=Path, required=True)
    parser.add_argument("--hang-rank", type=int, default=1)
    args = parser.parse_args()
    (args.marker_dir / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text("")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    value = torch.ones(1)
    for step in range(1000):
        if step == 3 and args.hang_rank == RANK:
            asleep_outside_any_section(args.marker_dir)
        client.start_section("step")
        dist.all_reduce(value)
        client.end_section("step")
        time.sleep(0.02)
    dist.destroy_process_group()
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
