"""A rank the launcher stopped is never the culprit (issue 28, the simulator's kill trial).

Real ft-launcher, 2 real gloo ranks: rank 1 dies of SIGKILL. Rank 0 either still runs when
torch's process context stops it with SIGTERM, or fails on its own in its all-reduce
("Connection closed by peer"). One run of the simulator's kill trial read "signal (ranks 0,1):
killed by SIGTERM", blaming the launcher's own SIGTERM: the diagnosis must name rank 1 alone,
killed by SIGKILL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS

from resiliency.goodput import read_ledger

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "workers" / "killed_peer_worker.py"


@pytest.mark.parametrize("mode", ["sleep", "collective"])
def test_the_killed_rank_is_the_culprit_not_the_rank_the_launcher_stopped(
    launch, marker_dir, tmp_path, mode
):
    ledger = tmp_path / "ledger"
    args = ["--nproc-per-node", "2", "--max-restarts", "0", *FAST_FT_FLAGS]
    launcher = launch([*args, "--goodput-dir", str(ledger), str(WORKER), str(marker_dir), mode])
    code = launcher.wait(180)
    log = launcher.log()
    assert code == 1, log
    assert "diagnosis: signal (ranks 1, nodes 0): killed by SIGKILL" in log, log
    (event,) = [e for e in read_ledger([ledger]).events if e.event == "diagnosis"]
    assert event.data["cls"] == "signal", event.data
    assert event.data["culprit_ranks"] == [1], event.data
    assert event.data["culprit_nodes"] == ["0"], event.data
    assert event.data["evidence"]["cause"] == "killed by SIGKILL", event.data
    (rank,) = event.data["evidence"]["ranks"]
    assert rank["rank"] == 1 and rank["signal"] == "SIGKILL", event.data
