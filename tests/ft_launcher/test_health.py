"""Node health checks: commands, callables, and the NVML GPU check that skips without a GPU."""

from __future__ import annotations

import sys
import types

import pytest

from resiliency.launcher.errors import HealthCheckError
from resiliency.launcher.health import (
    CallableHealthCheck,
    CommandHealthCheck,
    NvmlGpuHealthCheck,
    run_health_checks,
)


def test_command_check_passes_and_fails():
    ok = CommandHealthCheck(f"{sys.executable} -c 'print(\"fine\")'")()
    assert ok.healthy and ok.detail == "fine"
    bad = CommandHealthCheck(f"{sys.executable} -c 'import sys; sys.exit(\"ECC errors\")'")()
    assert not bad.healthy and "exit 1" in bad.detail and "ECC errors" in bad.detail
    missing = CommandHealthCheck("/no/such/health-binary")()
    assert not missing.healthy and "not found" in missing.detail
    slow = CommandHealthCheck(f"{sys.executable} -c 'import time; time.sleep(5)'", timeout=0.5)()
    assert not slow.healthy and "did not finish" in slow.detail
    with pytest.raises(HealthCheckError):
        CommandHealthCheck("  ")


def _module_with(name: str, fn) -> str:
    module = types.ModuleType(name)
    module.check = fn
    sys.modules[name] = module
    return f"{name}:check"


def test_callable_check_results():
    assert CallableHealthCheck(_module_with("hc_true", lambda: True))().healthy
    result = CallableHealthCheck(_module_with("hc_tuple", lambda: (False, "disk full")))()
    assert not result.healthy and result.detail == "disk full"

    def boom() -> bool:
        raise OSError("no /dev/nvidia0")

    raised = CallableHealthCheck(boom)()
    assert not raised.healthy and "OSError: no /dev/nvidia0" in raised.detail


@pytest.mark.parametrize("spec", ["nocolon", "no_such_module_qq:check", "sys:no_such_attr_qq"])
def test_callable_check_bad_spec(spec: str):
    with pytest.raises(HealthCheckError, match=spec.split(":", maxsplit=1)[0]):
        CallableHealthCheck(spec)


def test_gpu_check_skips_cleanly_without_a_driver():
    result = NvmlGpuHealthCheck()()
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_gpu = True
    except pynvml.NVMLError:
        has_gpu = False
    if has_gpu:
        pytest.skip("a GPU driver is present; the skip path cannot be exercised")
    assert result.healthy and result.skipped and result.detail.startswith("skipped")


def test_run_health_checks_runs_all_even_after_a_failure():
    results = run_health_checks(
        [CallableHealthCheck(lambda: False), CallableHealthCheck(lambda: True)]
    )
    assert [r.healthy for r in results] == [False, True]
