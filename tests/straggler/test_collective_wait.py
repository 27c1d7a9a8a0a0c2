"""A rank slow inside its backward pass under DDP: wall-time scores miss it, the section timed
net of the all-reduce wait names it (3 real gloo processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ._rank_processes import free_port, run_ranks

pytestmark = pytest.mark.slow

WORLD = 3
SLOW_RANK = 2
DELAY_S = 0.2
WORKER = Path(__file__).with_name("_ddp_worker.py")
DEADLINE_S = 240


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp")
    argv = [str(free_port()), str(out), str(SLOW_RANK), str(DELAY_S)]
    run_ranks(WORKER, WORLD, lambda rank: [str(rank), str(WORLD), *argv], DEADLINE_S)
    return json.loads((out / "report.json").read_text())


def test_wall_time_scores_miss_the_rank_slow_in_its_backward_pass(report: dict) -> None:
    wall = report["scores"]["step"]
    assert min(wall.values()) > 0.75, wall  # DDP's all-reduce evens the steps out
    assert "step" not in report["stragglers"]


def test_the_section_net_of_the_all_reduce_wait_names_it(report: dict) -> None:
    net = report["scores"]["step net of all-reduce wait"]
    assert net[str(SLOW_RANK)] < 0.5, net
    assert all(score > 0.75 for rank, score in net.items() if rank != str(SLOW_RANK)), net
    assert report["stragglers"] == {"step net of all-reduce wait": [SLOW_RANK]}
    assert report["blocked_s"] > 0  # rank 0 waited for the slow rank
