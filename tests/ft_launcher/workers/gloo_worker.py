"""A rank that initializes gloo, all-reduces, and (on --crash-rank) dies until --crash-until.

Restarting a group after gloo initialization is what torch's shared agent store gets wrong;
the launcher must bring the group up every time.
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker-dir", type=Path, required=True)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--crash-until", type=int, default=3, help="crash on attempts below this")
    parser.add_argument("--mode", default="crash", choices=["crash", "hang"])
    args = parser.parse_args()
    (args.marker_dir / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text("")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    value = torch.tensor([float(RANK + 1)])
    dist.all_reduce(value)
    expected = dist.get_world_size() * (dist.get_world_size() + 1) / 2
    assert value.item() == expected, (value.item(), expected)
    client.send_heartbeat()
    (args.marker_dir / f"reduced-{RANK}-{ATTEMPT}").write_text(str(value.item()))
    if args.crash_rank == RANK and args.crash_until > ATTEMPT:
        if args.mode == "hang":
            time.sleep(3600)
        os._exit(3)
    for _ in range(5):
        dist.all_reduce(value)
        client.send_heartbeat()
        time.sleep(0.05)
    dist.barrier()
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    (args.marker_dir / f"done-{RANK}-{ATTEMPT}").write_text("")
    return 0


if __name__ == "__main__":
    sys.exit(main())
