"""The last line and --exit-status-file name the hang verdict's culprit (issue 30, item 2).

The first timer to expire is usually a rank that waits for the culprit in a collective; here the
culprit's own monitor sees nothing wrong at all (it sleeps outside any section), so before the
fix the root cause always named an innocent rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, wait_for_markers

pytestmark = pytest.mark.slow

SECTION_WORKER = Path(__file__).parent / "workers" / "section_worker.py"


@pytest.mark.parametrize("nproc", [2, 3])
def test_root_cause_is_the_culprit(launch, marker_dir: Path, tmp_path: Path, nproc: int):
    status = tmp_path / "status.json"
    launcher = launch(
        [
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            "0",
            *FAST_FT_FLAGS,
            "--ft-rank-heartbeat-timeout",
            "null",
            "--ft-rank-section-timeouts",
            "step:2",
            "--exit-status-file",
            str(status),
            str(SECTION_WORKER),
            "--marker-dir",
            str(marker_dir),
        ]
    )
    wait_for_markers(marker_dir, "hang", 1, timeout=60)
    assert launcher.wait(60) == 1, launcher.log()
    lines = [line for line in launcher.log().splitlines() if "[ft-launcher]" in line]
    last = lines[-1]
    assert "exits 1 (restarts_exhausted): root cause: likely culprit of the hang: rank 1 " in last
    assert "rank 0 " not in last.split("root cause:")[1].split("while")[0], last
    verdict = json.loads(status.read_text())
    assert verdict["failures"][0].startswith("likely culprit of the hang: rank 1 ("), verdict
    assert "likely culprit: rank 1" in verdict["hang_verdicts"][0]
