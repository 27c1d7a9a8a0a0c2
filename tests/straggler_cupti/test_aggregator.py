"""The C++ aggregation core, fed synthetic kernel records (no GPU, no CUPTI)."""

from __future__ import annotations

import statistics

import pytest

from resiliency.straggler import KernelStats
from resiliency.straggler_cupti import KernelAggregator

T0 = 1_000_000_000  # an arbitrary GPU timestamp (ns); only differences matter


def feed(agg: KernelAggregator, name: str, durations_us: list[float], **shape: tuple) -> None:
    start = T0
    for d in durations_us:
        agg.add(name, start, start + round(d * 1000), **shape)
        start += 10_000_000


def only(stats: dict[str, KernelStats]) -> KernelStats:
    assert len(stats) == 1, stats
    return next(iter(stats.values()))


def test_odd_count_gives_exact_statistics() -> None:
    agg = KernelAggregator(key_by_shape=False)
    feed(agg, "gemm", [5.0, 1.0, 9.0, 3.0, 7.0])
    assert agg.read_and_reset() == {
        "gemm": KernelStats(count=5, min_us=1.0, max_us=9.0, median_us=5.0, mean_us=5.0)
    }


def test_even_count_median_is_mean_of_middle_pair() -> None:
    agg = KernelAggregator(key_by_shape=False)
    feed(agg, "gemm", [10.0, 2.0, 4.0, 100.0])
    stats = only(agg.read_and_reset())
    assert stats == KernelStats(count=4, min_us=2.0, max_us=100.0, median_us=7.0, mean_us=29.0)


def test_sub_microsecond_durations_keep_nanosecond_resolution() -> None:
    agg = KernelAggregator(key_by_shape=False)
    agg.add("tiny", T0, T0 + 1_500)
    agg.add("tiny", T0, T0 + 2_250)
    stats = only(agg.read_and_reset())
    assert stats.min_us == 1.5
    assert stats.max_us == 2.25
    assert stats.median_us == pytest.approx(1.875)
    assert stats.mean_us == pytest.approx(1.875)


def test_single_sample() -> None:
    agg = KernelAggregator(key_by_shape=False)
    feed(agg, "k", [42.0])
    assert only(agg.read_and_reset()) == KernelStats(1, 42.0, 42.0, 42.0, 42.0)


def test_read_resets_the_window() -> None:
    agg = KernelAggregator(key_by_shape=False)
    feed(agg, "k", [1.0, 2.0, 3.0])
    assert only(agg.read_and_reset()).count == 3
    assert agg.kernel_count == 0
    assert agg.read_and_reset() == {}
    # The next window's statistics see only its own samples.
    feed(agg, "k", [100.0, 200.0])
    assert only(agg.read_and_reset()) == KernelStats(2, 100.0, 200.0, 150.0, 150.0)


def test_several_kernels_are_kept_apart() -> None:
    agg = KernelAggregator(key_by_shape=False)
    feed(agg, "a", [1.0, 2.0, 3.0])
    feed(agg, "b", [10.0, 30.0])
    feed(agg, "c", [7.0])
    assert agg.kernel_count == 3
    assert agg.read_and_reset() == {
        "a": KernelStats(3, 1.0, 3.0, 2.0, 2.0),
        "b": KernelStats(2, 10.0, 30.0, 20.0, 20.0),
        "c": KernelStats(1, 7.0, 7.0, 7.0, 7.0),
    }


def test_interleaved_records_of_several_kernels() -> None:
    agg = KernelAggregator(key_by_shape=False)
    for i in range(1, 101):
        agg.add("even" if i % 2 == 0 else "odd", T0, T0 + i * 1000)
    stats = agg.read_and_reset()
    evens = [float(i) for i in range(2, 101, 2)]
    odds = [float(i) for i in range(1, 101, 2)]
    assert stats["even"] == KernelStats(
        50, 2.0, 100.0, statistics.median(evens), statistics.mean(evens)
    )
    assert stats["odd"] == KernelStats(
        50, 1.0, 99.0, statistics.median(odds), statistics.mean(odds)
    )


def test_launch_shape_is_part_of_the_key() -> None:
    agg = KernelAggregator()
    feed(agg, "gemm", [10.0, 12.0], grid=(64, 1, 1), block=(256, 1, 1))
    feed(agg, "gemm", [80.0], grid=(512, 2, 1), block=(256, 1, 1))
    feed(agg, "gemm", [5.0], grid=(64, 1, 1), block=(128, 1, 1))
    assert agg.read_and_reset() == {
        "gemm<<<(64,1,1),(256,1,1)>>>": KernelStats(2, 10.0, 12.0, 11.0, 11.0),
        "gemm<<<(512,2,1),(256,1,1)>>>": KernelStats(1, 80.0, 80.0, 80.0, 80.0),
        "gemm<<<(64,1,1),(128,1,1)>>>": KernelStats(1, 5.0, 5.0, 5.0, 5.0),
    }


def test_without_shape_keying_launches_of_one_kernel_merge() -> None:
    agg = KernelAggregator(key_by_shape=False)
    feed(agg, "gemm", [10.0, 12.0], grid=(64, 1, 1))
    feed(agg, "gemm", [80.0], grid=(512, 2, 1))
    assert agg.read_and_reset() == {"gemm": KernelStats(3, 10.0, 80.0, 12.0, 34.0)}


def test_full_kernel_table_drops_and_counts_new_keys() -> None:
    agg = KernelAggregator(max_kernels=2, key_by_shape=False)
    feed(agg, "a", [1.0])
    feed(agg, "b", [2.0])
    feed(agg, "c", [3.0, 4.0, 5.0])  # no room: three records dropped
    feed(agg, "a", [3.0])  # known keys still aggregate
    assert agg.dropped == 3
    assert agg.dropped_table_full == 3
    assert agg.read_and_reset() == {
        "a": KernelStats(2, 1.0, 3.0, 2.0, 2.0),
        "b": KernelStats(1, 2.0, 2.0, 2.0, 2.0),
    }
    # Drops are cumulative; a new window has room again.
    feed(agg, "c", [4.0])
    assert agg.dropped == 3
    assert set(agg.read_and_reset()) == {"c"}


def test_records_without_valid_timestamps_are_dropped_and_counted() -> None:
    agg = KernelAggregator(key_by_shape=False)
    agg.add("k", 0, T0)  # CUPTI's "no timestamp" marker
    agg.add("k", T0, 0)
    agg.add("k", T0 + 10, T0)  # ends before it starts
    agg.add("k", T0, T0 + 4000)
    assert agg.dropped_invalid == 3
    assert agg.dropped == 3
    assert only(agg.read_and_reset()) == KernelStats(1, 4.0, 4.0, 4.0, 4.0)


def test_sample_bound_keeps_count_min_max_mean_exact() -> None:
    agg = KernelAggregator(max_samples_per_kernel=64, key_by_shape=False)
    durations = [float(1 + (i * 37) % 1000) for i in range(10_000)]
    feed(agg, "k", durations)
    stats = only(agg.read_and_reset())
    assert stats.count == 10_000
    assert stats.min_us == min(durations)
    assert stats.max_us == max(durations)
    assert stats.mean_us == pytest.approx(statistics.mean(durations))
    # The median comes from a 64-sample uniform reservoir: close to the true one, not exact.
    assert abs(stats.median_us - statistics.median(durations)) < 200.0
    assert agg.dropped == 0  # sampling for the median is not a lost record


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_kernels": 0}, "max_kernels"),
        ({"max_samples_per_kernel": 0}, "max_samples_per_kernel"),
    ],
)
def test_limits_below_one_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KernelAggregator(**kwargs)
