"""Per-kernel duration statistics over synthetic or CUPTI activity records (C++, nanobind)."""

_Summary = tuple[str, int, float, float, float, float]

class KernelAggregator:
    def __init__(
        self, max_kernels: int, max_samples_per_kernel: int, key_by_shape: bool
    ) -> None: ...
    def add(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
    ) -> None: ...
    def read_and_reset(self) -> list[_Summary]:
        """(key, count, min_us, max_us, median_us, mean_us) per kernel key; clears the window."""
    @property
    def dropped(self) -> int: ...
    @property
    def dropped_table_full(self) -> int: ...
    @property
    def dropped_invalid(self) -> int: ...
    @property
    def kernel_count(self) -> int: ...
