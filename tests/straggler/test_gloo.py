"""Four real gloo processes: relative and individual scores, interval agreement, sub-groups."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ._fake_plugin import write_fake_plugin
from ._rank_processes import free_port, run_ranks

pytestmark = pytest.mark.slow

WORLD = 4
WORKER = Path(__file__).with_name("_gloo_worker.py")
DEADLINE_S = 120


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("gloo")
    plugin_dir = write_fake_plugin(tmp_path_factory.mktemp("plugin"))
    port = free_port()
    pythonpath = os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")]))
    run_ranks(
        WORKER,
        WORLD,
        lambda rank: [str(rank), str(WORLD), str(port), str(out)],
        DEADLINE_S,
        env=lambda rank: {
            **os.environ,
            "PYTHONPATH": pythonpath,
            "FAKE_KERNEL_SCALE": "2.0" if rank == 3 else "1.0",
        },
    )
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}


def test_slow_rank_flagged_only_in_its_section(results: dict[int, dict]) -> None:
    first = results[0]["relative_and_individual"]["first"]
    compute = first["section_relative"]["compute"]
    assert set(compute) == {"0", "1", "2", "3"}
    # The worker's clock makes every section last exactly what it says: the scores are exact.
    assert compute == {"0": 1.0, "1": 1.0, "2": 0.5, "3": 1.0}
    assert first["stragglers"]["straggler_sections_relative"] == {"compute": [[2, "node1"]]}
    assert first["rank_to_node"] == {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}
    assert set(first["section_relative"]["io"].values()) == {1.0}


def test_individual_scores_drop_when_a_rank_slows_down(results: dict[int, dict]) -> None:
    first = results[0]["relative_and_individual"]["first"]["section_individual"]["compute"]
    second = results[0]["relative_and_individual"]["second"]
    assert all(score == 1.0 for score in first.values())
    individual = second["section_individual"]["compute"]
    assert individual == {"0": 1.0, "1": 0.5, "2": 1.0, "3": 1.0}
    assert second["stragglers"]["straggler_sections_individual"] == {"compute": [[1, "node0"]]}


def test_other_ranks_get_no_report_when_gathered_on_rank0(results: dict[int, dict]) -> None:
    # Issue 10: as in NVIDIA's resiliency extension, ranks other than 0 get None (formerly a
    # report with empty score fields).
    for rank in (1, 2, 3):
        assert results[rank]["relative_and_individual"]["first"] is None
        assert results[rank]["gpu_scores"] is None


def test_gather_on_rank0_false_gives_each_rank_its_own_relative_score(
    results: dict[int, dict],
) -> None:
    for rank in range(WORLD):
        report = results[rank]["per_rank_reports"]
        assert list(report["section_relative"]["compute"]) == [str(rank)]
        score = report["section_relative"]["compute"][str(rank)]
        assert score == (0.5 if rank == 2 else 1.0)
        assert report["section_individual"] == {}


def test_interval_reports_come_in_the_same_iteration_on_every_rank(
    results: dict[int, dict],
) -> None:
    decisions = [results[r]["interval_decisions"]["reported_at"] for r in range(WORLD)]
    assert decisions[0], "no report in 50 iterations of >= 8 ms with a 0.25 s interval"
    assert all(d == decisions[0] for d in decisions), decisions
    # The root announces how many calls to skip: far fewer collectives than calls.
    assert results[0]["interval_decisions"]["checks"] < 40


def test_sub_groups_report_only_their_members(results: dict[int, dict]) -> None:
    group_a = results[0]["sub_groups"]["reports"]
    group_b = results[1]["sub_groups"]["reports"]
    assert len(group_a) == 1 and len(group_b) == 1
    scores_a = group_a[0]["section_relative"]["compute"]
    scores_b = group_b[0]["section_relative"]["compute"]
    assert set(scores_a) == {"0", "2"} and set(scores_b) == {"1", "3"}
    assert scores_a == {"0": 1.0, "2": 0.5}
    assert scores_b == {"1": 1.0, "3": 1.0}
    # Non-root members of each group get no report (None), in the same call.
    assert results[2]["sub_groups"]["reports"] == [None]


def test_individual_scores_per_rank_need_no_collective(results: dict[int, dict]) -> None:
    # Rank 0 reported three times, the others once: any collective would have hung.
    rank0 = results[0]["individual_without_communication"]["reports"]
    assert len(rank0) == 3
    assert rank0[2]["section_individual"]["compute"]["0"] == 0.5
    for rank in (1, 2, 3):
        reports = results[rank]["individual_without_communication"]["reports"]
        assert len(reports) == 1
        assert reports[0]["section_individual"] == {"compute": {str(rank): 1.0}}


def test_plugin_kernel_timings_score_the_slow_gpu(results: dict[int, dict]) -> None:
    report = results[0]["gpu_scores"]
    assert report["gpu_relative"] == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.5}
    assert report["gpu_individual"] == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0}
    assert report["stragglers"]["straggler_gpus_relative"] == [[3, socket.gethostname()]]
