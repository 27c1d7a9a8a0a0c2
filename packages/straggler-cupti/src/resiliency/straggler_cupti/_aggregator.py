"""The CUPTI-free aggregation core, usable directly to feed synthetic kernel records."""

from __future__ import annotations

from resiliency.straggler import KernelStats
from resiliency.straggler_cupti import _aggregation_ext

_Shape = tuple[int, int, int]


class KernelAggregator:
    """Per-kernel duration statistics over the records added since the last read.

    This is the C++ core the CUPTI profiler feeds from its buffer callbacks, exposed so kernel
    records can be replayed or synthesised without a GPU. Count, min, max and mean are exact;
    the median is exact up to ``max_samples_per_kernel`` samples per key and comes from a
    uniform reservoir sample past that.

    Args:
        max_kernels: Most distinct kernel keys per window; records of further keys are dropped
            and counted in :attr:`dropped`.
        max_samples_per_kernel: Durations kept per key for the median.
        key_by_shape: Key by kernel name and launch shape (``name<<<(grid),(block)>>>``) rather
            than by name alone.

    Raises:
        ValueError: A limit is below 1.
    """

    def __init__(
        self,
        max_kernels: int = 4096,
        max_samples_per_kernel: int = 2048,
        *,
        key_by_shape: bool = True,
    ) -> None:
        _check_limits(max_kernels, max_samples_per_kernel)
        self._native = _aggregation_ext.KernelAggregator(
            max_kernels, max_samples_per_kernel, key_by_shape
        )

    def add(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        grid: _Shape = (1, 1, 1),
        block: _Shape = (1, 1, 1),
    ) -> None:
        """Add one kernel record.

        Args:
            name: The kernel's (mangled) name.
            start_ns: GPU timestamp at which the kernel began, in nanoseconds.
            end_ns: GPU timestamp at which it ended, in nanoseconds.
            grid: Launch grid dimensions.
            block: Launch block dimensions.

        A record with a zero timestamp or ``end_ns < start_ns`` (what CUPTI delivers when it
        could not time a kernel) is dropped and counted in :attr:`dropped`.
        """
        self._native.add(name, start_ns, end_ns, grid, block)

    def read_and_reset(self) -> dict[str, KernelStats]:
        """Return the statistics per kernel key since the previous read and start a new window.

        Returns:
            Kernel key to :class:`~resiliency.straggler.KernelStats`, durations in microseconds.
        """
        return summaries_to_stats(self._native.read_and_reset())

    @property
    def dropped(self) -> int:
        """Records lost since construction (the key table was full, or invalid timestamps)."""
        return int(self._native.dropped)

    @property
    def dropped_table_full(self) -> int:
        """Records lost because their key was new and ``max_kernels`` keys were already held."""
        return int(self._native.dropped_table_full)

    @property
    def dropped_invalid(self) -> int:
        """Records lost because their timestamps were missing or out of order."""
        return int(self._native.dropped_invalid)

    @property
    def kernel_count(self) -> int:
        """Distinct kernel keys in the current window."""
        return int(self._native.kernel_count)


def _check_limits(max_kernels: int, max_samples_per_kernel: int) -> None:
    if max_kernels < 1:
        raise ValueError(f"max_kernels must be at least 1, got {max_kernels}")
    if max_samples_per_kernel < 1:
        raise ValueError(f"max_samples_per_kernel must be at least 1, got {max_samples_per_kernel}")


def summaries_to_stats(
    summaries: list[tuple[str, int, float, float, float, float]],
) -> dict[str, KernelStats]:
    """Convert the native modules' summary tuples into ``KernelStats`` by kernel key."""
    return {
        key: KernelStats(
            count=count, min_us=min_us, max_us=max_us, median_us=median_us, mean_us=mean_us
        )
        for key, count, min_us, max_us, median_us, mean_us in summaries
    }
