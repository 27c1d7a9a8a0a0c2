"""Spares inside the real wrapper (``rank_assignment.Tree``, the deprecated ``rank_filter``):
spares wait, the active ranks restart.

4 gloo ranks forked from ft-launcher's pre-imported server, as 2 "hosts" of 2 ranks with at most
one active rank per host (``jobs/train.py --tree-hosts 2``): initial ranks 0 and 2 train as a
world of 2, ranks 1 and 3 wait as spares. The topology keys go through the wrapper's TCPStore.
"""

from __future__ import annotations

import pytest
from inprocess_harness import FAULT_STEP, FtLauncher


@pytest.mark.slow
def test_a_rank_raises_the_active_ranks_restart_and_the_spares_never_train(
    ft_launcher: FtLauncher,
) -> None:
    run = ft_launcher.run("--tree-hosts", "2", "--raise", f"2@{FAULT_STEP}")
    assert run.returncode == 0, run.output[-6000:]
    for iteration in (0, 1):
        starts = run.starts(iteration)
        assert sorted(s["rank"] for s in starts) == [0, 2], (iteration, starts)
    assert {s["step"] for s in run.starts(1)} == {FAULT_STEP}
    done = {r["rank"]: r for r in run.records if r["event"] == "done"}
    assert sorted(done) == [0, 1, 2, 3], run.output[-6000:]
    # the spares returned from the wrapper without calling the function
    assert done[1]["params"] is None and done[3]["params"] is None
    assert done[0]["params"] == done[2]["params"] and done[0]["step"] == done[2]["step"]
    assert "restart 0 -> 1" in run.output


@pytest.mark.slow
def test_the_deprecated_rank_filter_keeps_a_spare_out_of_training_across_a_restart(
    ft_launcher: FtLauncher,
) -> None:
    # NVRx's rank_filter=MaxActiveWorldSize(3): ranks 0-2 train as a world of 3, rank 3 waits
    run = ft_launcher.run("--rank-filter", "3", "--raise", f"1@{FAULT_STEP}")
    assert run.returncode == 0, run.output[-6000:]
    assert "Wrapper(rank_filter=...) is deprecated" in run.output
    for iteration in (0, 1):
        assert sorted(s["rank"] for s in run.starts(iteration)) == [0, 1, 2], iteration
    assert {s["step"] for s in run.starts(1)} == {FAULT_STEP}
    done = {r["rank"]: r for r in run.records if r["event"] == "done"}
    assert sorted(done) == [0, 1, 2, 3], run.output[-6000:]
    assert done[3]["params"] is None
    assert done[0]["params"] == done[1]["params"] == done[2]["params"]
