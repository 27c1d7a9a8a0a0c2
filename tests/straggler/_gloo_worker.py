"""One rank of the 4-process gloo scenarios run by test_gloo.py; writes its results as JSON.

Usage: python _gloo_worker.py RANK WORLD PORT OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from resiliency.straggler import Detector, Report

FAST_S = 0.02
IO_S = 0.01
ITERATIONS = 8


class _Clock:
    """The Detector's clock, advanced by the section bodies: a section lasts exactly what it says.

    Sleeps of 20 and 40 ms are not 1:2 on a loaded two-core machine; this clock makes the scores
    exact and leaves the collectives (gathers, the schedule's agreement) real.
    """

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


CLOCK = _Clock()


def _scores(report: Report | None) -> dict | None:
    if report is None:  # not rank 0 with gather_on_rank0=True, as in NVIDIA's tool
        return None
    return {
        "rank": report.rank,
        "section_relative": report.section_relative_perf_scores,
        "section_individual": report.section_individual_perf_scores,
        "rank_to_node": report.rank_to_node,
        "stragglers": {
            key: sorted([[s.rank, s.node] for s in value])
            if isinstance(value, set)
            else {k: sorted([[s.rank, s.node] for s in v]) for k, v in value.items()}
            for key, value in report.identify_stragglers().items()
        },
    }


def _window(rank: int, slow_ranks: set[int]) -> None:
    for _ in range(ITERATIONS):
        with Detector.detection_section("compute"):
            CLOCK.advance(FAST_S * (2 if rank in slow_ranks else 1))
        with Detector.detection_section("io", profile_cuda=False):
            CLOCK.advance(IO_S)


def relative_and_individual(rank: int) -> dict:
    """Rank 2 is 2x slower in "compute"; in the second window rank 1 slows down too."""
    Detector.initialize(
        scores_to_compute="all", gather_on_rank0=True, node_name=f"node{rank // 2}", clock=CLOCK
    )
    _window(rank, {2})
    first = Detector.generate_report()
    _window(rank, {1, 2})
    second = Detector.generate_report()
    Detector.shutdown()
    return {"first": _scores(first), "second": _scores(second)}


def per_rank_reports(rank: int) -> dict:
    """gather_on_rank0=False: every rank gets its own relative score."""
    Detector.initialize(
        scores_to_compute=["relative_perf_scores"], gather_on_rank0=False, clock=CLOCK
    )
    _window(rank, {2})
    report = Detector.generate_report()
    Detector.shutdown()
    return _scores(report)


def interval_decisions(rank: int) -> dict:
    """Ranks run at different paces; reports must come in the same iteration everywhere."""
    Detector.initialize(report_time_interval=0.25, clock=CLOCK)
    reported_at = []
    for iteration in range(50):
        with Detector.detection_section("step"):
            CLOCK.advance(0.008 + 0.003 * rank)
        Detector.generate_report_if_interval_elapsed()
        if Detector.is_interval_elapsed():  # a report was produced by that call (on rank 0)
            reported_at.append(iteration)
    checks = Detector._require().schedule.checks
    Detector.shutdown()
    return {"reported_at": reported_at, "checks": checks}


def sub_groups(rank: int) -> dict:
    """Two Detectors on disjoint sub-groups {0, 2} and {1, 3}; rank 2 is slow."""
    group_a = dist.new_group([0, 2])
    group_b = dist.new_group([1, 3])
    group = group_a if rank in (0, 2) else group_b
    Detector.initialize(process_group=group, report_time_interval=0.2, clock=CLOCK)
    reports = []
    for _ in range(40):
        with Detector.detection_section("compute"):
            CLOCK.advance(FAST_S * (2 if rank == 2 else 1))
        report = Detector.generate_report_if_interval_elapsed()
        if Detector.is_interval_elapsed():
            reports.append(_scores(report))
            break
    Detector.shutdown()
    return {"reports": reports}


def individual_without_communication(rank: int) -> dict:
    """Individual scores kept per rank need no collective: ranks report different counts."""
    Detector.initialize(
        scores_to_compute=["individual_perf_scores"], gather_on_rank0=False, clock=CLOCK
    )
    results = []
    for window in range(1 + (rank == 0) * 2):
        for _ in range(4):
            with Detector.detection_section("compute"):
                CLOCK.advance(FAST_S * (2 if window == 2 else 1))
        results.append(_scores(Detector.generate_report()))
    Detector.shutdown()
    return {"reports": results}


def gpu_scores(rank: int) -> dict:
    """The fake kernel-profiler plug-in reports 2x slower kernels on rank 3."""
    os.environ["RESILIENCY_STRAGGLER_KERNEL_PROFILER"] = "good"
    Detector.initialize(clock=CLOCK)
    for _ in range(3):
        with Detector.detection_section("forward"):
            pass
    report = Detector.generate_report()
    Detector.shutdown()
    os.environ["RESILIENCY_STRAGGLER_KERNEL_PROFILER"] = "none"
    result = _scores(report)
    if report is not None and result is not None:
        result["gpu_relative"] = report.gpu_relative_perf_scores
        result["gpu_individual"] = report.gpu_individual_perf_scores
    return result


SCENARIOS = [
    gpu_scores,
    relative_and_individual,
    per_rank_reports,
    interval_decisions,
    sub_groups,
    individual_without_communication,
]


def main() -> None:
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=30),
    )
    os.environ["RESILIENCY_STRAGGLER_KERNEL_PROFILER"] = "none"
    results = {}
    for scenario in SCENARIOS:
        results[scenario.__name__] = scenario(rank)
        dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
