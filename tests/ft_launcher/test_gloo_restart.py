"""A group that initialized gloo restarts reliably, several times in a row (per-round store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, markers

pytestmark = pytest.mark.slow

GLOO_WORKER = Path(__file__).parent / "workers" / "gloo_worker.py"


# The crashes restart 4 times: those workers fork from a server that imported torch once (as with
# --ft-preimport in a user's job), 1 import of torch instead of 8. The hangs keep the plain
# start, so both ways of starting workers re-form a gloo group several times in a row.
@pytest.mark.parametrize(
    ("mode", "start"), [("crash", ["--ft-preimport", "torch"]), ("hang", [])], ids=["crash", "hang"]
)
def test_gloo_group_restarts_three_times_in_a_row(
    launch, marker_dir: Path, mode: str, start: list[str]
):
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            *FAST_FT_FLAGS,
            *start,
            "--ft-initial-rank-heartbeat-timeout",
            "30",
            # The same crash three times in a row would stop the job (issue 28's stop rule):
            # this test is about restarting gloo, so it is off here.
            "--ft-max-no-progress-cycles",
            "0",
            str(GLOO_WORKER),
            "--marker-dir",
            str(marker_dir),
            "--crash-until",
            "3" if mode == "crash" else "2",
            "--mode",
            mode,
        ]
    )
    assert launcher.wait(90) == 0, launcher.log()
    attempts = 4 if mode == "crash" else 3
    # Every attempt got through init_process_group and an all-reduce on both ranks.
    assert markers(marker_dir, "reduced") == sorted(
        f"reduced-{rank}-{attempt}" for rank in (0, 1) for attempt in range(attempts)
    )
    assert markers(marker_dir, "done") == [f"done-0-{attempts - 1}", f"done-1-{attempts - 1}"]
