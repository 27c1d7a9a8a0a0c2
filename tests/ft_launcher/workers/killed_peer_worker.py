"""Rank 1 is SIGKILLed (by itself, as from outside) while rank 0 runs on (issue 28).

Mode ``sleep``: rank 0 heartbeats outside any collective, so it is still running when the
launcher stops it (SIGTERM). Mode ``collective``: rank 0 all-reduces in a loop, so it fails on
its own a few milliseconds after rank 1 dies (gloo: "Connection closed by peer") and leaves that
error in its ``@record`` error file. Either way rank 1 is the culprit. Markers:
start-<rank>-<attempt>-<pid>, reduced-<rank>.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from resiliency.ft import RankMonitorClient

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@record
def main() -> None:
    marker_dir, mode = Path(sys.argv[1]), sys.argv[2]
    (marker_dir / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text("")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    value = torch.ones(1)
    dist.all_reduce(value)
    client.send_heartbeat()
    (marker_dir / f"reduced-{RANK}").write_text("")
    if RANK == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # ended by the launcher, or by the peer's death
        if mode == "collective":
            dist.all_reduce(value)
        client.send_heartbeat()
        time.sleep(0.02)
    raise TimeoutError("rank 0 was never stopped")


if __name__ == "__main__":
    main()
