"""The Detector on a single rank: lifecycle, errors, reports, runtime settings.

Scores are checked with an injected clock (``Detector.initialize(clock=...)``) that moves only
inside the sections, so every duration and score is exact. One test times real sleeps, end to end,
with generous bounds.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from resiliency.straggler import (
    Detector,
    DetectorStateError,
    StragglerConfigError,
    StragglerId,
    Thresholds,
)


class ManualClock:
    """A nanosecond clock that moves only when told to."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _timed(clock: ManualClock, name: str, *durations: float) -> None:
    """Enter section ``name`` once per duration; each entry lasts exactly that many seconds."""
    for seconds in durations:
        with Detector.detection_section(name, profile_cuda=False):
            clock.advance(seconds)


def test_single_rank_report_without_a_process_group(clock: ManualClock) -> None:
    Detector.initialize(node_name="laptop", clock=clock)
    _timed(clock, "data", 0.001, 0.002, 0.003, 0.004, 0.010)
    report = Detector.generate_report()
    assert report.rank == 0 and report.rank_to_node == {0: "laptop"}
    assert report.section_relative_perf_scores == {"data": {0: 1.0}}
    assert report.section_individual_perf_scores == {"data": {0: 1.0}}
    summary = report.local_section_summaries["data"]
    assert summary.count == 5
    assert (summary.min_us, summary.median_us, summary.max_us) == (1000.0, 3000.0, 10_000.0)
    assert summary.mean_us == pytest.approx(4000.0)
    assert report.generate_report_elapsed_time > 0
    assert report.identify_stragglers()["straggler_sections_relative"] == {}


def test_individual_score_drops_when_the_rank_slows_down(clock: ManualClock) -> None:
    Detector.initialize(scores_to_compute=["individual_perf_scores"], clock=clock)
    _timed(clock, "step", *[0.010] * 5)
    assert Detector.generate_report().section_individual_perf_scores == {"step": {0: 1.0}}
    _timed(clock, "step", *[0.020] * 5)
    report = Detector.generate_report()
    assert report.section_individual_perf_scores["step"][0] == pytest.approx(0.5)
    assert report.section_relative_perf_scores == {}
    flagged = report.identify_stragglers()["straggler_sections_individual"]
    assert flagged == {"step": {StragglerId(0, report.rank_to_node[0])}}
    # Back to its best speed: the history keeps the best window, the score recovers.
    _timed(clock, "step", *[0.010] * 5)
    report = Detector.generate_report()
    assert report.section_individual_perf_scores["step"][0] == pytest.approx(1.0)
    assert report.identify_stragglers()["straggler_sections_individual"] == {}


def test_the_score_uses_the_window_median_not_one_slow_entry(clock: ManualClock) -> None:
    Detector.initialize(scores_to_compute=["individual_perf_scores"], clock=clock)
    _timed(clock, "step", 0.010, 0.010, 0.010)
    Detector.generate_report()
    _timed(clock, "step", 0.010, 0.500, 0.010)  # one hiccup is not a straggler
    report = Detector.generate_report()
    assert report.section_individual_perf_scores["step"][0] == pytest.approx(1.0)
    assert report.local_section_summaries["step"].max_us == 500_000.0


def test_profiling_interval_times_every_nth_entry_only(clock: ManualClock) -> None:
    Detector.initialize(profiling_interval=2, clock=clock)
    _timed(clock, "s", 0.001, 0.009, 0.001, 0.009)  # the 2nd and 4th entries are timed
    summary = Detector.generate_report().local_section_summaries["s"]
    assert (summary.count, summary.min_us, summary.max_us) == (2, 9000.0, 9000.0)


def test_real_sleeps_end_to_end_flag_a_slowdown() -> None:
    """The default clocks, real sleeps: a step five times slower is flagged (generous bounds)."""
    Detector.initialize(scores_to_compute=["individual_perf_scores"])
    for seconds in (0.01, 0.05):
        for _ in range(5):
            with Detector.detection_section("step", profile_cuda=False):
                time.sleep(seconds)
        report = Detector.generate_report()
    median_us = report.local_section_summaries["step"].median_us
    assert 50_000 <= median_us < 500_000  # a sleep is never shorter than asked
    score = report.section_individual_perf_scores["step"][0]
    assert 0.0 < score < 0.75  # expected 0.2; flagged below the default threshold
    assert report.identify_stragglers()["straggler_sections_individual"] == {
        "step": {StragglerId(0, report.rank_to_node[0])}
    }


def test_a_section_without_samples_in_a_window_has_no_score(clock: ManualClock) -> None:
    Detector.initialize(clock=clock)
    _timed(clock, "a", 0.0, 0.0)
    _timed(clock, "b", 0.0, 0.0)
    Detector.generate_report()
    _timed(clock, "a", 0.0, 0.0)
    report = Detector.generate_report()
    assert set(report.section_relative_perf_scores) == {"a"}
    assert set(report.section_individual_perf_scores) == {"a"}
    assert set(report.local_section_summaries) == {"a"}


def test_lifecycle_errors_name_the_fix() -> None:
    with pytest.raises(DetectorStateError, match=r"initialize\(\) first"):
        Detector.detection_section("x")
    with pytest.raises(DetectorStateError, match="not initialized"):
        Detector.generate_report()
    Detector.initialize()
    with pytest.raises(DetectorStateError, match=r"shutdown\(\) first"):
        Detector.initialize()
    Detector.shutdown()
    Detector.shutdown()  # twice is fine
    assert not Detector.initialized
    with pytest.raises(TypeError, match="class methods"):
        Detector()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scores_to_compute": ["relative"]}, "scores_to_compute"),
        ({"scores_to_compute": []}, "scores_to_compute"),
        ({"profiling_interval": 0}, "profiling_interval"),
        ({"profiling_interval": 1.5}, "profiling_interval"),
        ({"report_time_interval": 0}, "report_time_interval"),
        ({"report_time_interval": float("inf")}, "report_time_interval"),
        ({"node_name": 3}, "node_name"),
        ({"samples_per_section": 0}, "samples_per_section"),
        ({"clock": 5}, "clock"),
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(StragglerConfigError, match=message):
        Detector.initialize(**kwargs)
    assert not Detector.initialized


def test_a_process_group_without_torch_distributed_is_an_error() -> None:
    with pytest.raises(StragglerConfigError, match="not initialized"):
        Detector.initialize(process_group=object())


def test_thresholds_change_at_runtime_and_travel_with_the_report(clock: ManualClock) -> None:
    Detector.initialize(scores_to_compute=["individual_perf_scores"], clock=clock)
    _timed(clock, "s", *[0.005] * 5)
    Detector.generate_report()
    _timed(clock, "s", *[0.009] * 5)
    loose = Detector.generate_report()
    score = loose.section_individual_perf_scores["s"][0]
    assert score == pytest.approx(5 / 9)
    assert (
        loose.identify_stragglers(section_indiv_threshold=0.55)["straggler_sections_individual"]
        == {}
    )
    assert loose.identify_stragglers(section_indiv_threshold=0.56)["straggler_sections_individual"]
    assert (
        loose.identify_stragglers(section_indiv_threshold=0.1)["straggler_sections_individual"]
        == {}
    )
    assert loose.identify_stragglers(section_indiv_threshold=1.0)["straggler_sections_individual"]
    Detector.set_thresholds(section_indiv_threshold=0.05)
    _timed(clock, "s", *[0.009] * 5)
    strict = Detector.generate_report()
    assert strict.thresholds.section_indiv_threshold == 0.05
    assert strict.thresholds.gpu_rel_threshold == 0.75
    assert strict.identify_stragglers()["straggler_sections_individual"] == {}
    with pytest.raises(StragglerConfigError, match="in \\[0, 1\\]"):
        Detector.set_thresholds(gpu_rel_threshold=1.5)
    with pytest.raises(StragglerConfigError):
        Thresholds(section_rel_threshold=float("nan"))


def test_report_interval_single_rank_and_runtime_change(clock: ManualClock) -> None:
    # is_interval_elapsed() says whether the last generate_report_if_interval_elapsed() call
    # produced a report (NVIDIA's semantics; formerly it checked the clock itself).
    Detector.initialize(report_time_interval=3600, clock=clock)
    assert not Detector.is_interval_elapsed()
    clock.advance(3599.9)
    assert Detector.generate_report_if_interval_elapsed() is None
    assert not Detector.is_interval_elapsed()
    clock.advance(0.2)
    assert Detector.generate_report_if_interval_elapsed() is not None
    Detector.set_report_time_interval(0.05)  # counted from that report
    clock.advance(0.04)
    assert Detector.generate_report_if_interval_elapsed() is None
    clock.advance(0.02)
    assert not Detector.is_interval_elapsed()  # no new call yet
    assert Detector.generate_report_if_interval_elapsed() is not None
    assert Detector.is_interval_elapsed()
    assert Detector.generate_report_if_interval_elapsed() is None  # a report starts an interval
    assert not Detector.is_interval_elapsed()
    with pytest.raises(StragglerConfigError):
        Detector.set_report_time_interval(-1)


def test_profile_cuda_without_gpu_warns_once_and_times_cpu(
    straggler_logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESILIENCY_STRAGGLER_KERNEL_PROFILER", "none")
    Detector.initialize()
    for name in ("a", "b", "a"):
        with Detector.detection_section(name, profile_cuda=True):
            pass
    warnings = [r.getMessage() for r in straggler_logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "CPU time only" in warnings[0]
    report = Detector.generate_report()
    assert report.local_section_summaries["a"].count == 2
    assert report.local_kernel_summaries == {} and report.gpu_relative_perf_scores == {}


def test_importing_and_reporting_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from resiliency.straggler import Detector\n"
        "Detector.initialize()\n"
        "with Detector.detection_section('x'):\n    pass\n"
        "Detector.generate_report()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env_python = sys.executable
    done = subprocess.run(
        [env_python, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
