"""A rank under torch's @record that raises the same ValueError at the same step every attempt.

Rank 1 raises ``ValueError: bad batch at step 3 ...`` (a deterministic data error: no restart can
fix it), or with a second argument ``import`` imports a module that does not exist (a
configuration error); the other ranks heartbeat until they are stopped. With a second argument
``progress`` the job gains steps before each failure: rank 0 records step ``100 * attempt`` in the
goodput ledger (flushed) before rank 1 raises the same error. Markers:
start-<rank>-<attempt>-<pid>, progress-<attempt>.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from resiliency.ft import RankMonitorClient
from resiliency.goodput import get_recorder

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
    progress = marker_dir / f"progress-{ATTEMPT}"
    if sys.argv[2:] == ["progress"]:
        if RANK == 0:
            recorder = get_recorder()
            recorder.step(100 * ATTEMPT)
            recorder.flush()
            progress.write_text("")
        else:  # fail only once this attempt's progress is in the ledger
            deadline = time.monotonic() + 60
            while not progress.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank 0 never wrote {progress}")
                time.sleep(0.02)
    for step in range(1000):
        client.send_heartbeat()
        if RANK == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}: label 7 is out of range [0, 5)")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
