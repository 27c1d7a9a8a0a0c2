"""Rank 1 ends on a configuration error the way the toolkit's ranks do: exit 78 (EX_CONFIG).

The other ranks heartbeat until they are stopped. Markers: start-<rank>-<attempt>-<pid>.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from resiliency.ft import RankMonitorClient

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
EX_CONFIG = 78


def main() -> int:
    (Path(sys.argv[1]) / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text("")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    for _ in range(2400):
        client.send_heartbeat()
        if RANK == 1:
            print("rank 1: the checkpoint directory is not writable; fix --ckpt-dir", flush=True)
            return EX_CONFIG
        time.sleep(0.05)
    raise TimeoutError("rank 0 was never stopped")


if __name__ == "__main__":
    sys.exit(main())
