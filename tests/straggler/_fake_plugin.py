"""Writes a real, importable distribution that registers kernel-profiler plug-ins.

``importlib.metadata`` finds it through a ``*.dist-info/entry_points.txt`` on ``sys.path``, exactly
as it finds an installed wheel. Its profilers report fixed kernel timings scaled by the
``FAKE_KERNEL_SCALE`` environment variable, with launch counts proportional to the number of
profiled section entries they saw.
"""

from __future__ import annotations

from pathlib import Path

MODULE = "fake_kernel_profilers_for_tests"

_SOURCE = """
import os

from resiliency.straggler import KernelStats

GEMM_US = 100.0
RELU_US = 10.0


class GoodProfiler:
    API_VERSION = 1
    instances = []

    def __init__(self):
        self.depth = 0
        self.entries = 0
        self.max_depth = 0
        self.shut = 0
        self.dropped = int(os.environ.get("FAKE_KERNEL_DROPPED", "0"))
        GoodProfiler.instances.append(self)

    def start(self):
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)

    def stop(self):
        if self.depth == 0:
            raise RuntimeError("stop() without start()")
        self.depth -= 1
        if self.depth == 0:
            self.entries += 1

    def read_and_reset(self):
        scale = float(os.environ.get("FAKE_KERNEL_SCALE", "1.0"))
        n, self.entries = self.entries, 0
        if n == 0:
            return {}
        gemm, relu = GEMM_US * scale, RELU_US * scale
        return {
            "gemm": KernelStats(2 * n, gemm, gemm, gemm, gemm),
            "relu": KernelStats(3 * n, relu, relu, relu, relu),
        }

    def dropped_records(self):
        return self.dropped

    def shutdown(self):
        self.shut += 1


class OldProfiler(GoodProfiler):
    API_VERSION = 99


def broken_factory():
    raise RuntimeError("no CUDA device visible to the fake profiler")


broken_factory.API_VERSION = 1


class NotAProfiler:
    API_VERSION = 1
"""

_ENTRY_POINTS = f"""[resiliency.straggler.kernel_profilers]
broken = {MODULE}:broken_factory
good = {MODULE}:GoodProfiler
incomplete = {MODULE}:NotAProfiler
missing = {MODULE}_absent:Nothing
old = {MODULE}:OldProfiler
"""


def write_fake_plugin(root: Path) -> Path:
    """Create the distribution under ``root`` and return ``root`` (to put on ``sys.path``)."""
    (root / f"{MODULE}.py").write_text(_SOURCE)
    info = root / f"{MODULE}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(_ENTRY_POINTS)
    return root
