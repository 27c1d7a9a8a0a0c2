"""The GPU health checks after a fault (NVRx 0.5's ``restart_health_check``), on the tests'
fake ``pynvml``: which checks the Wrapper builds, what each one decides, and a rank whose GPU
needs a reset leaving the job at the restart."""

from __future__ import annotations

import logging
import sys
from types import ModuleType

import pytest
import torch.distributed as dist
from fake_nvml_module import load_fake_pynvml

from resiliency import inprocess
from resiliency.inprocess.exception import HealthCheckError
from resiliency.inprocess.health_check import (
    ChainedGPUHealthCheck,
    ChainedNVLHealthCheck,
    HealthCheck,
    local_gpu_index,
)


class _Passes(HealthCheck):
    def __call__(self, state: inprocess.FrozenState) -> inprocess.FrozenState:
        return state


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_fake_pynvml(monkeypatch, count=2)


def _state() -> inprocess.FrozenState:
    return inprocess.State(rank=3, world_size=4).freeze()


def test_without_local_rank_the_restart_check_is_the_users_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert inprocess.Wrapper().restart_health_check is None
    user = _Passes()
    assert inprocess.Wrapper(health_check=user).restart_health_check is user


def test_with_local_rank_the_gpu_checks_follow_the_users_and_run_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first, second = _Passes(), _Passes()
    check = inprocess.Wrapper(health_check=inprocess.Compose(first, second)).restart_health_check
    assert isinstance(check, inprocess.Compose) and isinstance(check, HealthCheck)
    parts = check.instances
    assert parts[:2] == (first, second)  # a user's Compose is flattened
    assert [type(p) for p in parts[2:]] == [ChainedGPUHealthCheck, ChainedNVLHealthCheck]
    assert parts[2].device_index == parts[3].device_index == 1
    alone = inprocess.Wrapper().restart_health_check
    assert [type(p) for p in alone.instances] == [ChainedGPUHealthCheck, ChainedNVLHealthCheck]


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [("2", None, 2), ("1", "4,5,6,7", 5), ("1", "GPU-aa,GPU-bb", 1), (None, "0", None)],
)
def test_the_gpu_index_is_local_rank_through_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, local_rank: str | None, visible: str | None, index: int | None
) -> None:
    for name, value in (("LOCAL_RANK", local_rank), ("CUDA_VISIBLE_DEVICES", visible)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert local_gpu_index() == index


def test_a_gpu_that_needs_a_reset_fails_its_check_and_says_what_to_do(nvml: ModuleType) -> None:
    check = ChainedGPUHealthCheck(1)
    assert check(_state()) == _state()
    nvml.set_recovery_action(1, nvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    with pytest.raises(HealthCheckError, match=r"rank 3: GPU 1 .*asks for gpu_reset.*leaves"):
        check(_state())
    assert ChainedGPUHealthCheck(0)(_state()) == _state()  # the other GPU is fine


def test_an_nvlink_down_is_reported_and_the_rank_stays(
    nvml: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.set_nvlinks(0, [nvml.NVML_FEATURE_ENABLED, nvml.NVML_FEATURE_DISABLED])
    with caplog.at_level(logging.WARNING, logger="resiliency.inprocess.health_check"):
        assert ChainedNVLHealthCheck(0)(_state()) == _state()
    assert "GPU 0: NVLink(s) [1] down" in caplog.text


def test_without_nvml_or_with_a_wrong_index_the_checks_pass(
    monkeypatch: pytest.MonkeyPatch, nvml: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="resiliency.inprocess.health_check"):
        assert ChainedGPUHealthCheck(7)(_state()) == _state()
    assert "none with index 7" in caplog.text
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails: a CPU machine
    assert ChainedGPUHealthCheck(0)(_state()) == _state()
    assert ChainedNVLHealthCheck(0)(_state()) == _state()


def test_a_rank_whose_gpu_needs_a_reset_leaves_the_job_at_the_restart(
    one_rank: dist.HashStore, nvml: ModuleType
) -> None:
    calls: list[int] = []

    @inprocess.Wrapper(store_factory=lambda: one_rank)
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> str:
        assert call_wrapper is not None
        calls.append(call_wrapper.iteration)
        if call_wrapper.iteration == 0:
            nvml.set_recovery_action(0, nvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
            raise RuntimeError("an Xid brought the GPU down")
        return "restarted"

    with pytest.raises(HealthCheckError, match=r"GPU 0 .*node_reboot"):
        train()
    assert calls == [0]  # never called again on a GPU that cannot be trusted


def test_a_rank_whose_gpu_is_healthy_restarts(one_rank: dist.HashStore, nvml: ModuleType) -> None:
    @inprocess.Wrapper(store_factory=lambda: one_rank)
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> int:
        assert call_wrapper is not None
        if call_wrapper.iteration == 0:
            raise RuntimeError("a fault of the application, not of the GPU")
        return call_wrapper.iteration

    assert train() == 1
