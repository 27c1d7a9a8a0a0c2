"""The plug-in is registered where resiliency.straggler looks for kernel profilers."""

from __future__ import annotations

from importlib.metadata import entry_points

from resiliency.straggler import API_VERSION, ENTRY_POINT_GROUP, KernelProfiler
from resiliency.straggler_cupti import CuptiKernelProfiler


def test_entry_point_is_registered_and_loads() -> None:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "cupti"]
    assert len(found) == 1, list(entry_points(group=ENTRY_POINT_GROUP))
    factory = found[0].load()
    assert factory is CuptiKernelProfiler
    assert factory.API_VERSION == 1
    assert factory.API_VERSION == API_VERSION


def test_calling_the_entry_point_gives_a_kernel_profiler_without_a_gpu() -> None:
    (ep,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "cupti"]
    profiler = ep.load()()
    try:
        assert isinstance(profiler, KernelProfiler)
        assert profiler.API_VERSION == 1
    finally:
        profiler.shutdown()
