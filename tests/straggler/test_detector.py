"""The Detector on a single rank: lifecycle, errors, reports, runtime settings."""

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


def _timed(name: str, seconds: float, times: int = 5) -> None:
    for _ in range(times):
        with Detector.detection_section(name, profile_cuda=False):
            time.sleep(seconds)


def test_single_rank_report_without_a_process_group() -> None:
    Detector.initialize(node_name="laptop")
    _timed("data", 0.002)
    report = Detector.generate_report()
    assert report.rank == 0 and report.rank_to_node == {0: "laptop"}
    assert report.section_relative_perf_scores == {"data": {0: 1.0}}
    assert report.section_individual_perf_scores == {"data": {0: 1.0}}
    summary = report.local_section_summaries["data"]
    assert summary.count == 5 and 2000 <= summary.median_us < 200_000
    assert summary.min_us <= summary.median_us <= summary.max_us
    assert report.generate_report_elapsed_time > 0
    assert report.identify_stragglers()["straggler_sections_relative"] == {}


def test_individual_score_drops_when_the_rank_slows_down() -> None:
    Detector.initialize(scores_to_compute=["individual_perf_scores"])
    _timed("step", 0.01)
    assert Detector.generate_report().section_individual_perf_scores == {"step": {0: 1.0}}
    _timed("step", 0.02)
    report = Detector.generate_report()
    assert 0.35 < report.section_individual_perf_scores["step"][0] < 0.65
    assert report.section_relative_perf_scores == {}
    flagged = report.identify_stragglers()["straggler_sections_individual"]
    assert flagged == {"step": {StragglerId(0, report.rank_to_node[0])}}


def test_a_section_without_samples_in_a_window_has_no_score() -> None:
    Detector.initialize()
    _timed("a", 0.0, 2)
    _timed("b", 0.0, 2)
    Detector.generate_report()
    _timed("a", 0.0, 2)
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
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(StragglerConfigError, match=message):
        Detector.initialize(**kwargs)
    assert not Detector.initialized


def test_a_process_group_without_torch_distributed_is_an_error() -> None:
    with pytest.raises(StragglerConfigError, match="not initialized"):
        Detector.initialize(process_group=object())


def test_thresholds_change_at_runtime_and_travel_with_the_report() -> None:
    Detector.initialize(scores_to_compute=["individual_perf_scores"])
    _timed("s", 0.005)
    Detector.generate_report()
    _timed("s", 0.009)
    loose = Detector.generate_report()
    score = loose.section_individual_perf_scores["s"][0]
    assert 0.3 < score < 0.9
    assert (
        loose.identify_stragglers(section_indiv_threshold=0.1)["straggler_sections_individual"]
        == {}
    )
    assert loose.identify_stragglers(section_indiv_threshold=1.0)["straggler_sections_individual"]
    Detector.set_thresholds(section_indiv_threshold=0.05)
    _timed("s", 0.009)
    strict = Detector.generate_report()
    assert strict.thresholds.section_indiv_threshold == 0.05
    assert strict.thresholds.gpu_rel_threshold == 0.75
    assert strict.identify_stragglers()["straggler_sections_individual"] == {}
    with pytest.raises(StragglerConfigError, match="in \\[0, 1\\]"):
        Detector.set_thresholds(gpu_rel_threshold=1.5)
    with pytest.raises(StragglerConfigError):
        Thresholds(section_rel_threshold=float("nan"))


def test_report_interval_single_rank_and_runtime_change() -> None:
    # is_interval_elapsed() says whether the last generate_report_if_interval_elapsed() call
    # produced a report (NVIDIA's semantics; formerly it checked the clock itself).
    Detector.initialize(report_time_interval=3600)
    assert not Detector.is_interval_elapsed()
    assert Detector.generate_report_if_interval_elapsed() is None
    assert not Detector.is_interval_elapsed()
    Detector.set_report_time_interval(0.05)
    time.sleep(0.06)
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
