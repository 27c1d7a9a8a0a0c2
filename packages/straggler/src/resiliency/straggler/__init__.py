"""resiliency.straggler: straggler detection for distributed training."""

from resiliency.straggler.profiler import API_VERSION, ENTRY_POINT_GROUP, KernelProfiler, KernelStats

__all__ = ["API_VERSION", "ENTRY_POINT_GROUP", "KernelProfiler", "KernelStats"]
