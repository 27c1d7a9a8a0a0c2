"""The CUDA-event fallback on a real GPU (no kernel-profiler plug-in): skipped without one."""

from __future__ import annotations

import pytest

from resiliency.straggler import Detector

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_sections_are_timed_on_the_gpu_with_cuda_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESILIENCY_STRAGGLER_KERNEL_PROFILER", "none")
    small = torch.randn(256, 256, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    Detector.initialize(node_name="gpu-node")
    try:
        for _ in range(20):
            with Detector.detection_section("small"):
                small @ small
            with Detector.detection_section("big"):
                big @ big
        torch.cuda.synchronize()
        report = Detector.generate_report()
    finally:
        Detector.shutdown()
    kernels = report.local_kernel_summaries
    assert kernels, "the CUDA-event fallback recorded no GPU time"
    big_stats = next(v for k, v in kernels.items() if "big" in k)
    small_stats = next(v for k, v in kernels.items() if "small" in k)
    assert big_stats.count == 20 and small_stats.count == 20
    # A 4096^3 matmul takes far longer on the GPU than a 256^3 one.
    assert big_stats.median_us > 10 * small_stats.median_us
    assert report.gpu_individual_perf_scores.get(0) is not None
