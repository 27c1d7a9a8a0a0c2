"""A rank under torch's @record that raises the same ValueError at the same step every attempt.

Rank 1 raises ``ValueError: bad batch at step 3 ...`` (a deterministic data error: no restart can
fix it), or with a second argument ``import`` imports a module that does not exist (a
configuration error); the other ranks heartbeat until they are stopped. Markers:
start-<rank>-<attempt>-<pid>.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from resiliency.ft import RankMonitorClient

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@record
def main() -> None:
    marker_dir = Path(sys.argv[1])
    (marker_dir / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text(f"{time.time()}\n")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    if RANK == 1 and sys.argv[2:] == ["import"]:
        importlib.import_module("resiliency_no_such_module")
    for step in range(1000):
        client.send_heartbeat()
        if RANK == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}: label 7 is out of range [0, 5)")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
