"""resiliency.straggler_cupti: per-kernel GPU timings from CUPTI for the straggler Detector.

The profiler is found by ``resiliency.straggler`` through the entry-point group
``resiliency.straggler.kernel_profilers``; it can also be used directly::

    profiler = CuptiKernelProfiler()
    profiler.start()
    ...  # CUDA work
    torch.cuda.synchronize()
    stats = profiler.read_and_reset()  # kernel key -> KernelStats

Importing this package never needs a GPU, a driver or libcupti; :meth:`CuptiKernelProfiler.start`
raises :class:`CuptiUnavailableError` where kernels cannot be timed.
"""

from resiliency.straggler_cupti._aggregator import KernelAggregator
from resiliency.straggler_cupti._errors import (
    CuptiCallError,
    CuptiLibraryNotFoundError,
    CuptiProfilerError,
    CuptiUnavailableError,
    ProfilerStateError,
)
from resiliency.straggler_cupti._profiler import CuptiKernelProfiler

__all__ = [
    "CuptiCallError",
    "CuptiKernelProfiler",
    "CuptiLibraryNotFoundError",
    "CuptiProfilerError",
    "CuptiUnavailableError",
    "KernelAggregator",
    "ProfilerStateError",
]
