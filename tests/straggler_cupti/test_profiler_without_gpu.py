"""What a user sees on a machine without a GPU: imports work, start() says why it cannot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from resiliency.straggler import KernelProfiler
from resiliency.straggler_cupti import (
    CuptiKernelProfiler,
    CuptiLibraryNotFoundError,
    CuptiProfilerError,
    CuptiUnavailableError,
    ProfilerStateError,
)
from resiliency.straggler_cupti._driver_probe import gpu_unavailable_reason
from resiliency.straggler_cupti._native import _explain_import_error, cupti_module

NO_GPU_REASON = gpu_unavailable_reason()
needs_no_gpu = pytest.mark.skipif(NO_GPU_REASON is None, reason="a GPU is present here")


@pytest.fixture
def profiler() -> CuptiKernelProfiler:
    p = CuptiKernelProfiler()
    yield p
    p.shutdown()


def test_constructing_needs_no_gpu(profiler: CuptiKernelProfiler) -> None:
    assert isinstance(profiler, KernelProfiler)
    assert not profiler.active
    assert profiler.read_and_reset() == {}
    assert profiler.dropped_records() == 0
    assert profiler.counters() == {}


@needs_no_gpu
def test_start_without_a_gpu_raises_a_clear_error(profiler: CuptiKernelProfiler) -> None:
    with pytest.raises(CuptiUnavailableError) as info:
        profiler.start()
    message = str(info.value)
    assert "cannot time CUDA kernels" in message
    assert NO_GPU_REASON is not None and NO_GPU_REASON in message
    assert "CPU section scores" in message  # says what happens instead
    assert isinstance(info.value, CuptiProfilerError)
    assert not profiler.active
    # Nothing was started, so there is nothing to stop; reads stay empty.
    with pytest.raises(ProfilerStateError, match="without a matching start"):
        profiler.stop()
    assert profiler.read_and_reset() == {}
    assert profiler.dropped_records() == 0


@needs_no_gpu
def test_cupti_itself_refuses_without_a_driver() -> None:
    native = cupti_module()
    if native.BACKEND != "cupti":
        pytest.skip("stub build")
    native.configure(16, 16, True, 1 << 16, 2)
    with pytest.raises(native.CuptiCallError) as info:
        native.start()
    assert info.value.call.startswith("cuptiActivityEnable")
    assert info.value.code == 999  # CUPTI_ERROR_UNKNOWN, which is why the driver is probed first
    assert native.depth() == 0
    assert native.read_and_reset() == []
    assert native.dropped_records() == 0


def test_shutdown_is_idempotent_and_final(profiler: CuptiKernelProfiler) -> None:
    profiler.shutdown()
    profiler.shutdown()
    with pytest.raises(ProfilerStateError, match="shut down"):
        profiler.start()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"buffer_size": 100}, "buffer_size"),
        ({"buffer_count": 0}, "buffer_count"),
        ({"max_kernels": 0}, "max_kernels"),
        ({"max_samples_per_kernel": -1}, "max_samples_per_kernel"),
    ],
)
def test_bad_sizes_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CuptiKernelProfiler(**kwargs)


def test_unloadable_native_module_is_a_clear_import_error() -> None:
    # A fresh interpreter where the native module cannot be imported (as when libcupti is
    # missing): the package still imports, and start() raises an ImportError that says so.
    code = (
        "import sys\n"
        "sys.modules['resiliency.straggler_cupti._cupti_ext'] = None\n"
        "from resiliency.straggler_cupti import CuptiKernelProfiler, CuptiLibraryNotFoundError\n"
        "p = CuptiKernelProfiler()\n"
        "try:\n"
        "    p.start()\n"
        "except CuptiLibraryNotFoundError as exc:\n"
        "    assert isinstance(exc, ImportError)\n"
        "    print('REFUSED:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "REFUSED:" in out.stdout
    assert "reinstall resiliency-straggler-cupti" in out.stdout


def test_missing_libcupti_message_says_what_to_install() -> None:
    text = _explain_import_error(
        ImportError("libcupti.so.13: cannot open shared object file: No such file or directory")
    )
    assert "pip install nvidia-cuda-cupti" in text
    assert "LD_LIBRARY_PATH" in text
    assert issubclass(CuptiLibraryNotFoundError, ImportError)
