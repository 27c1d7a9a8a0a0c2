"""Choice of the GPU timing back end: a kernel-profiler plug-in, CUDA events, or none.

Order: the first usable plug-in (:mod:`.plugins`); else CUDA events when torch is already imported
and sees a GPU (:mod:`.cuda_timing`); else CPU time only, with one warning.
"""

from __future__ import annotations

import logging
from typing import Protocol

from resiliency.straggler._cuda_timing import CudaEventTimer
from resiliency.straggler._plugins import load_kernel_profiler
from resiliency.straggler.profiler import KernelProfiler, KernelStats

__all__ = ["GpuBackend", "PluginTimer", "select_gpu_backend"]

log = logging.getLogger(__name__)


class GpuBackend(Protocol):
    """A GPU timing back end as the Detector drives it."""

    description: str

    def enter(self, section: str) -> None:
        """A timed section entry begins."""
        ...

    def exit(self, section: str) -> None:
        """The matching entry ends."""
        ...

    def read(self) -> dict[str, KernelStats]:
        """Per-kernel (or per-section) statistics since the previous read."""
        ...

    def dropped(self) -> int:
        """Total records lost so far."""
        ...

    def shutdown(self) -> None:
        """Release the back end."""
        ...


class PluginTimer:
    """Drives a :class:`KernelProfiler` from section entries and exits.

    A profiler that raises is logged once and disabled: a broken profiler must not stop training.

    Args:
        profiler: The plug-in's profiler.
        description: How logs name it.
    """

    def __init__(self, profiler: KernelProfiler, description: str) -> None:
        self._profiler = profiler
        self.description = description
        self._failed = False

    def _disable(self, what: str, exc: Exception) -> None:
        self._failed = True
        log.error(
            "%s raised in %s() and is disabled; GPU scores stop until the next initialize(): "
            "%s: %s",
            self.description,
            what,
            type(exc).__name__,
            exc,
        )

    def enter(self, section: str) -> None:
        """Start (or nest) kernel collection."""
        if self._failed:
            return
        try:
            self._profiler.start()
        except Exception as exc:
            self._disable("start", exc)

    def exit(self, section: str) -> None:
        """End one level of kernel collection."""
        if self._failed:
            return
        try:
            self._profiler.stop()
        except Exception as exc:
            self._disable("stop", exc)

    def read(self) -> dict[str, KernelStats]:
        """Kernel statistics since the previous read (empty once the profiler failed)."""
        if self._failed:
            return {}
        try:
            return dict(self._profiler.read_and_reset())
        except Exception as exc:
            self._disable("read_and_reset", exc)
            return {}

    def dropped(self) -> int:
        """Records the profiler lost so far."""
        if self._failed:
            return 0
        try:
            return int(self._profiler.dropped_records())
        except Exception as exc:
            self._disable("dropped_records", exc)
            return 0

    def shutdown(self) -> None:
        """Shut the profiler down (errors are logged)."""
        try:
            self._profiler.shutdown()
        except Exception as exc:
            log.error("%s raised in shutdown(): %s: %s", self.description, type(exc).__name__, exc)


def select_gpu_backend() -> GpuBackend | None:
    """Pick the GPU timing back end for ``profile_cuda=True`` sections.

    Returns:
        A back end, or ``None`` (CPU time only, after one warning).
    """
    loaded = load_kernel_profiler()
    if loaded is not None:
        return PluginTimer(loaded.profiler, f"kernel-profiler plug-in {loaded.name!r}")
    events = CudaEventTimer.create()
    if events is not None:
        log.info("GPU timing with %s", events.description)
        return events
    log.warning(
        "profile_cuda=True but no kernel-profiler plug-in is usable and torch sees no CUDA GPU: "
        "sections record CPU time only and reports carry no GPU scores. Install "
        "resiliency-straggler-cupti on a GPU machine for per-kernel timing."
    )
    return None
