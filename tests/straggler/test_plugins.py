"""Kernel-profiler plug-ins found through a real entry point: scores, version check, fallback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from resiliency.straggler import Detector, StragglerId
from resiliency.straggler._plugins import SELECT_ENV, load_kernel_profiler

from ._fake_plugin import MODULE, write_fake_plugin


@pytest.fixture
def fake_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.syspath_prepend(str(write_fake_plugin(tmp_path)))
    monkeypatch.delenv("FAKE_KERNEL_SCALE", raising=False)
    yield
    sys.modules.pop(MODULE, None)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _run_window(n: int) -> None:
    for _ in range(n):
        with Detector.detection_section("step"):
            pass


def test_first_usable_plugin_is_chosen_after_skipping_broken_ones(
    fake_plugin: object, straggler_logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SELECT_ENV, raising=False)
    loaded = load_kernel_profiler()
    assert loaded is not None and loaded.name == "good"
    warnings = _warnings(straggler_logs)
    # "broken" sorts before "good": its factory failure is one warning, then "good" wins.
    assert len(warnings) == 1
    assert "'broken'" in warnings[0] and "no CUDA device visible" in warnings[0]


def test_unsupported_api_version_is_skipped_with_one_warning(
    fake_plugin: object, straggler_logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SELECT_ENV, "old")
    Detector.initialize()
    _run_window(3)
    report = Detector.generate_report()
    version_warnings = [w for w in _warnings(straggler_logs) if "API_VERSION 99" in w]
    assert len(version_warnings) == 1
    assert "supports only 1" in version_warnings[0] and "skipped" in version_warnings[0]
    # Fell back to CPU timing (no GPU here): still a report, no GPU scores.
    assert report.gpu_relative_perf_scores == {}
    assert report.section_relative_perf_scores == {"step": {0: 1.0}}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing", "could not be imported"),
        ("incomplete", "lacks the KernelProfiler methods"),
        ("broken", "failed to start"),
        ("nonexistent", "names no installed kernel-profiler plug-in"),
    ],
)
def test_unusable_plugins_warn_once_and_fall_back(
    fake_plugin: object,
    straggler_logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    message: str,
) -> None:
    monkeypatch.setenv(SELECT_ENV, name)
    assert load_kernel_profiler() is None
    matching = [w for w in _warnings(straggler_logs) if message in w]
    assert len(matching) == 1, _warnings(straggler_logs)


def test_plugin_kernel_timings_give_the_expected_gpu_scores(
    fake_plugin: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SELECT_ENV, "good")
    Detector.initialize(report_time_interval=3600)
    _run_window(4)
    first = Detector.generate_report()
    assert first.gpu_relative_perf_scores == {0: 1.0}
    assert first.gpu_individual_perf_scores == {0: 1.0}
    assert first.local_kernel_summaries["gemm"].count == 8
    assert first.local_kernel_summaries["relu"].median_us == 10.0

    # The GEMM kernels get 3x slower, the ReLU kernels do not. Weighted by this rank's launch
    # counts (2 GEMM and 3 ReLU per entry): (2*100 + 3*10) / (2*300 + 3*10) = 230 / 630.
    monkeypatch.setenv("FAKE_KERNEL_SCALE", "1.0")
    profiler_module = sys.modules[MODULE]
    monkeypatch.setattr(profiler_module, "GEMM_US", 300.0)
    _run_window(4)
    second = Detector.generate_report()
    assert second.gpu_individual_perf_scores[0] == pytest.approx(230 / 630)
    assert second.identify_stragglers()["straggler_gpus_individual"] == {
        StragglerId(0, second.rank_to_node[0])
    }


def test_sections_nest_profiler_start_stop_and_profiling_interval_applies(
    fake_plugin: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SELECT_ENV, "good")
    Detector.initialize(profiling_interval=2)
    for _ in range(6):
        with Detector.detection_section("outer"), Detector.detection_section("inner"):
            pass
    profiler = sys.modules[MODULE].GoodProfiler.instances[-1]
    assert profiler.max_depth == 2 and profiler.depth == 0
    assert profiler.entries == 3  # every 2nd entry of 6 was profiled
    report = Detector.generate_report()
    assert report.local_section_summaries["outer"].count == 3
    Detector.shutdown()
    assert profiler.shut == 1


def test_dropped_records_are_reported_as_a_warning(
    fake_plugin: object, straggler_logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SELECT_ENV, "good")
    monkeypatch.setenv("FAKE_KERNEL_DROPPED", "17")
    Detector.initialize()
    _run_window(2)
    Detector.generate_report()
    Detector.generate_report()  # the count did not grow: no second warning
    dropped = [w for w in _warnings(straggler_logs) if "lost 17 GPU timing records" in w]
    assert len(dropped) == 1 and dropped[0].startswith("rank 0:")


def test_a_profiler_that_raises_mid_run_is_disabled_not_fatal(
    fake_plugin: object, straggler_logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SELECT_ENV, "good")
    Detector.initialize()
    _run_window(1)
    profiler = sys.modules[MODULE].GoodProfiler.instances[-1]
    monkeypatch.setattr(profiler, "start", _raise)
    _run_window(3)  # must not raise into the training loop
    report = Detector.generate_report()
    assert report.local_section_summaries["step"].count == 4
    assert report.gpu_relative_perf_scores == {}
    errors = [r.getMessage() for r in straggler_logs.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "raised in start()" in errors[0]


def _raise() -> None:
    raise RuntimeError("CUPTI went away")
