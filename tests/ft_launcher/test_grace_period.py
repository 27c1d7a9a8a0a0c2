"""--ft-termination-grace-period means what it says for a hung rank (issue 30, item 4).

The monitor sends the termination signal, then SIGKILL after the grace period; the launcher waits
for that instead of cancelling it and leaving the rank to torch's --workers-stop-timeout.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, wait_for_markers

pytestmark = pytest.mark.slow

_SCRIPT = """\
import os, signal, sys, time
from pathlib import Path
from resiliency.ft import RankMonitorClient

marker_dir, rank = Path(sys.argv[1]), os.environ["RANK"]
(marker_dir / f"start-{rank}-0-{os.getpid()}").write_text("")
client = RankMonitorClient()
client.init_workload_monitoring()
for _ in range(5):
    client.send_heartbeat()
    time.sleep(0.05)
if rank == "0":
    signal.signal(signal.SIGTERM, lambda s, f: print("rank 0 ignores SIGTERM", flush=True))
    (marker_dir / "hang-0-0").write_text("")
    while True:
        time.sleep(3600)
while True:
    client.send_heartbeat()
    time.sleep(0.05)
"""


def test_hung_rank_that_ignores_sigterm_is_killed_after_the_grace_period(
    launch, marker_dir: Path, tmp_path: Path
):
    script = tmp_path / "ignores_sigterm.py"
    script.write_text(_SCRIPT)
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            *FAST_FT_FLAGS,
            "--ft-termination-grace-period",
            "2",
            "--workers-stop-timeout",
            "60",  # what the hung rank got before the fix
            str(script),
            str(marker_dir),
        ]
    )
    wait_for_markers(marker_dir, "hang", 1, timeout=60)
    hung_at = time.monotonic()
    assert launcher.wait(90) == 1, launcher.log()
    took = time.monotonic() - hung_at
    log = launcher.log()
    # Expected: 1.5 s heartbeat timeout + 2 s grace + a restart's bookkeeping (~5 s); far below
    # the 60 s the hung rank waited under torch's --workers-stop-timeout.
    assert took < 40, f"the launcher took {took:.1f} s after the hang; log:\n{log}"
    assert "still runs 2.0 s after SIGTERM; sending SIGKILL" in log, log
    assert "hung, is gone: ended by its monitor's SIGKILL" in log, log
    assert "its monitor stops it (SIGTERM, SIGKILL after 2 s)" in log
    assert "terminated it" not in log
    assert "the launcher stopped rank 0" not in log  # the escalation was never cancelled
