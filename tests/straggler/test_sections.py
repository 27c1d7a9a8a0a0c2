"""Section timing: bounded memory, sampling, nesting, exceptions."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from resiliency.straggler import Detector
from resiliency.straggler.sections import SectionTimings, summarize


def test_ring_keeps_the_most_recent_durations_and_counts_all() -> None:
    timings = SectionTimings("s", capacity=4, profiling_interval=1)
    for d in range(10):
        timings.record(d)
    count, kept = timings.drain()
    assert count == 10 and sorted(kept) == [6, 7, 8, 9]
    assert timings.drain() == (0, [])
    assert summarize(0, []) is None


def test_memory_stays_bounded_however_long_the_run() -> None:
    Detector.initialize(samples_per_section=256)
    section = Detector.detection_section("hot", profile_cuda=False)
    tracemalloc.start()
    try:
        for _ in range(1000):  # fill the ring once: its int objects are the fixed cost
            with section:
                pass
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(50_000):
            with section:
                pass
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 1024
    assert Detector.generate_report().local_section_summaries["hot"].count == 51_000


def test_profiling_interval_times_every_nth_entry_and_can_change_at_runtime() -> None:
    Detector.initialize(profiling_interval=3)
    for _ in range(9):
        with Detector.detection_section("s", profile_cuda=False):
            pass
    assert Detector.generate_report().local_section_summaries["s"].count == 3
    Detector.set_profiling_interval(1)
    for _ in range(5):
        with Detector.detection_section("s", profile_cuda=False):
            pass
    assert Detector.generate_report().local_section_summaries["s"].count == 5


def test_recursive_entries_and_exceptions_are_timed_correctly() -> None:
    Detector.initialize()
    section = Detector.detection_section("r", profile_cuda=False)
    with section:
        time.sleep(0.02)
        with section:
            time.sleep(0.001)
    with pytest.raises(KeyError), section:
        raise KeyError("boom")
    summary = Detector.generate_report().local_section_summaries["r"]
    assert summary.count == 3
    assert summary.max_us >= 20_000 and summary.min_us < 20_000


def test_the_same_name_returns_the_same_reusable_object() -> None:
    Detector.initialize()
    first = Detector.detection_section("a", profile_cuda=False)
    assert Detector.detection_section("a", profile_cuda=False) is first


def test_unnamed_sections_are_named_after_the_callers_file_and_line() -> None:
    Detector.initialize()
    for _ in range(2):
        with Detector.detection_section(profile_cuda=False):
            pass
    names = list(Detector.generate_report().local_section_summaries)
    assert len(names) == 1
    path, line = names[0].rsplit(":", 1)
    assert path == "tests/straggler/test_sections.py" or path.endswith("test_sections.py")
    assert int(line) > 0
