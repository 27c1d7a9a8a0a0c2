"""CuptiKernelProfiler: the straggler kernel-profiler plug-in backed by CUPTI's activity API."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from resiliency.straggler import KernelStats
from resiliency.straggler_cupti._aggregator import _check_limits, summaries_to_stats
from resiliency.straggler_cupti._driver_probe import gpu_unavailable_reason
from resiliency.straggler_cupti._errors import (
    CuptiCallError,
    CuptiUnavailableError,
    ProfilerStateError,
)
from resiliency.straggler_cupti._native import cupti_module

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# CUPTI's activity buffers are global to a process: one profiler owns them at a time.
_owner_lock = threading.Lock()
_owner: CuptiKernelProfiler | None = None


class CuptiKernelProfiler:
    """Per-kernel GPU durations from CUPTI, implementing ``resiliency.straggler.KernelProfiler``.

    Records of concurrent kernels reach a bounded pool of activity buffers through CUPTI's
    buffer callbacks and are aggregated in C++ per kernel key. Constructing one never fails for
    lack of a GPU; :meth:`start` raises :class:`CuptiUnavailableError` there. One profiler per
    process can collect at a time (CUPTI's buffers are process-wide); call :meth:`shutdown` to
    hand them to another.

    Args:
        key_by_shape: Key statistics by kernel name and launch shape (``name<<<(grid),(block)>>>``)
            instead of by name alone, so one kernel run on different problem sizes is not mixed.
        max_kernels: Most distinct kernel keys per read window; further keys are dropped and
            counted.
        max_samples_per_kernel: Durations kept per key for the median (reservoir past it).
        buffer_size: Bytes per activity buffer handed to CUPTI.
        buffer_count: Most activity buffers at once; when all are in use CUPTI drops records
            and they are counted.

    Raises:
        ValueError: A size or limit is out of range.
    """

    API_VERSION: int = 1
    """The ``resiliency.straggler`` kernel-profiler interface version implemented."""

    def __init__(
        self,
        *,
        key_by_shape: bool = True,
        max_kernels: int = 4096,
        max_samples_per_kernel: int = 2048,
        buffer_size: int = 1 << 20,
        buffer_count: int = 8,
    ) -> None:
        _check_limits(max_kernels, max_samples_per_kernel)
        if buffer_size < 1024:
            raise ValueError(f"buffer_size must be at least 1024 bytes, got {buffer_size}")
        if buffer_count < 1:
            raise ValueError(f"buffer_count must be at least 1, got {buffer_count}")
        self._config = (
            max_kernels,
            max_samples_per_kernel,
            key_by_shape,
            buffer_size,
            buffer_count,
        )
        self._lock = threading.Lock()
        self._native: ModuleType | None = None
        self._depth = 0
        self._shut_down = False
        self._reported_dropped = 0
        self._reported_callback_errors = 0

    @property
    def active(self) -> bool:
        """True while :meth:`start` calls outnumber :meth:`stop` calls."""
        return self._depth > 0

    def start(self) -> None:
        """Begin collecting kernel activity, or nest one level deeper if already collecting.

        Raises:
            CuptiUnavailableError: No NVIDIA driver or GPU is reachable, or this is a stub build.
            CuptiLibraryNotFoundError: libcupti could not be loaded.
            CuptiCallError: CUPTI refused to enable kernel activity collection.
            ProfilerStateError: The profiler was shut down, or another profiler owns CUPTI.
        """
        global _owner
        with self._lock:
            if self._shut_down:
                raise ProfilerStateError(
                    "this CuptiKernelProfiler was shut down; create a new one to collect again"
                )
            if self._depth > 0:
                native = self._require_native()
                _translate(native, native.start)
                self._depth += 1
                return
            with _owner_lock:
                if _owner is not None and _owner is not self:
                    raise ProfilerStateError(
                        "another CuptiKernelProfiler already collects in this process (CUPTI's "
                        "activity buffers are process-wide); call its shutdown() first"
                    )
                native = self._load_native()
                if _owner is None:
                    _translate(native, lambda: native.configure(*self._config))
                _translate(native, native.start)
                _owner = self
            self._depth = 1
            logger.info("CUPTI kernel collection started (CUPTI API %s)", native.cupti_version())

    def stop(self) -> None:
        """End one level of collection; the outermost stop disables CUPTI kernel activity.

        Raises:
            ProfilerStateError: No matching :meth:`start`.
            CuptiCallError: CUPTI refused to disable kernel activity collection.
        """
        with self._lock:
            if self._depth == 0:
                raise ProfilerStateError("stop() called without a matching start()")
            native = self._require_native()
            _translate(native, native.stop)
            self._depth -= 1

    def read_and_reset(self) -> dict[str, KernelStats]:
        """Flush completed activity buffers and return per-kernel statistics since the last read.

        Kernels still running on the GPU are reported by a later read; synchronize the device
        first (``torch.cuda.synchronize()``) to include every kernel launched so far.

        Returns:
            Kernel key to :class:`~resiliency.straggler.KernelStats` (microseconds); empty
            before the first :meth:`start`.

        Raises:
            CuptiCallError: The flush failed.
        """
        with self._lock:
            if self._native is None or _owner is not self:
                return {}
            native = self._native
            stats = summaries_to_stats(_translate(native, native.read_and_reset))
            self._report_losses(native)
            return stats

    def dropped_records(self) -> int:
        """Records lost since this profiler first started.

        Counts records CUPTI could not store (all pool buffers in use), records of kernel keys
        beyond ``max_kernels``, and records CUPTI delivered without timestamps.

        Returns:
            The cumulative number of lost records.
        """
        with self._lock:
            if self._native is None or _owner is not self:
                return 0
            native = self._native
            return int(_translate(native, native.dropped_records))

    def counters(self) -> dict[str, int]:
        """Return the collector's diagnostic counters (drops by cause, buffers, records seen).

        Returns:
            Counter name to value; empty before the first :meth:`start`.
        """
        with self._lock:
            if self._native is None or _owner is not self:
                return {}
            return dict(self._native.counters())

    def shutdown(self) -> None:
        """Stop collecting at any nesting depth and release CUPTI for another profiler.

        Only the kernel activity kind this profiler enabled is disabled; CUPTI itself stays
        attached (no ``cuptiFinalize``), so other CUPTI users in the process carry on. Safe to
        call twice.

        Raises:
            CuptiCallError: CUPTI refused to disable collection or to flush.
        """
        global _owner
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
            self._depth = 0
            with _owner_lock:
                if _owner is not self or self._native is None:
                    return
                native = self._native
                try:
                    _translate(native, native.shutdown)
                finally:
                    _owner = None
            logger.info("CUPTI kernel collection shut down")

    def _require_native(self) -> ModuleType:
        if self._native is None:
            raise ProfilerStateError("the profiler has not been started")
        return self._native

    def _load_native(self) -> ModuleType:
        native = cupti_module()
        if native.BACKEND == "stub":
            raise CuptiUnavailableError(
                "cannot time CUDA kernels: resiliency-straggler-cupti was built as a stub "
                "(RESILIENCY_CUPTI_STUB=ON). Reinstall it where a CUDA toolkit or NVIDIA's CUPTI "
                "wheels are present, without RESILIENCY_CUPTI_STUB (see docs/straggler_cupti.md)."
            )
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise CuptiUnavailableError(
                f"cannot time CUDA kernels: {reason}. CUPTI kernel timing needs an NVIDIA GPU "
                "and driver; without one, leave the profiler stopped (the straggler Detector "
                "then reports CPU section scores only)."
            )
        self._native = native
        return native

    def _report_losses(self, native: ModuleType) -> None:
        # Losses are never silent: each read that finds new ones logs them with their causes.
        counters = native.counters()
        dropped = int(
            counters["cupti_dropped"] + counters["dropped_table_full"] + counters["dropped_invalid"]
        )
        if dropped > self._reported_dropped:
            logger.warning(
                "CUPTI profiler lost %d kernel records since the last read (total %d: %d not "
                "stored by CUPTI, %d buffer requests refused by the full pool, %d beyond "
                "max_kernels, %d without timestamps); raise buffer_count/buffer_size or "
                "max_kernels if this repeats",
                dropped - self._reported_dropped,
                dropped,
                counters["cupti_dropped"],
                counters["pool_exhausted"],
                counters["dropped_table_full"],
                counters["dropped_invalid"],
            )
            self._reported_dropped = dropped
        errors = int(counters["callback_errors"])
        if errors > self._reported_callback_errors:
            logger.error(
                "CUPTI profiler failed to process %d activity buffers since the last read",
                errors - self._reported_callback_errors,
            )
            self._reported_callback_errors = errors


def _translate(native: ModuleType, call: Callable[[], _T]) -> _T:
    """Run a native call, turning its exceptions into this package's."""
    try:
        return call()
    except native.CuptiCallError as exc:
        raise CuptiCallError(
            f"{exc}. If another profiler (Nsight Systems, torch.profiler, DCGM profiling) is "
            "attached to this process, stop it or leave this profiler off.",
            call=exc.call,
            code=exc.code,
        ) from exc
    except native.CuptiUnavailableError as exc:
        raise CuptiUnavailableError(str(exc)) from exc
    except native.CollectorStateError as exc:
        raise ProfilerStateError(str(exc)) from exc
