"""NVIDIA's launcher 'config dump' scenario, restated: connect, write the config, exit 0.

Four gloo ranks start, meet at a barrier, connect to their monitors and end with ``sys.exit(0)``
without a heartbeat and without saying goodbye; rank 0 first writes the configuration its client
received from the monitor. The interpreter's teardown (torch, gloo) then takes longer than the
1 s initial heartbeat timeout the scenario sets, which is what the launcher must survive.
Markers: start-<rank>-<attempt>-<pid> (for the fixture's clean-up).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from resiliency.ft import RankMonitorClient

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def main() -> int:
    marker_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    (marker_dir / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text(f"{time.time()}\n")
    dist.init_process_group(backend="gloo")
    dist.barrier()
    if RANK == 0:
        print("ALL RANKS STARTED", flush=True)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    if RANK == 0:
        assert client.cfg is not None
        client.cfg.to_yaml_file(out_dir / "cfg_dump.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
