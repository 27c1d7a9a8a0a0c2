"""Health checks: decide, after a fault, whether this rank may take part in the restart."""

from __future__ import annotations

import abc
import datetime
import logging
import os
import threading

import torch

from resiliency.ft import GpuProbe
from resiliency.inprocess.exception import HealthCheckError, RestartError, TimeoutError
from resiliency.inprocess.state import FrozenState

log = logging.getLogger(__name__)


class HealthCheck(abc.ABC):
    """Base class of ``health_check``; raising any exception takes this rank out of the job."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        """Check this rank.

        Args:
            state: read-only wrapper state.

        Returns:
            ``state``, unchanged, if the rank is healthy.
        """


class CudaHealthCheck(HealthCheck):
    """Synchronize this rank's CUDA device within ``timeout``; a no-op without CUDA.

    Args:
        timeout: how long the synchronization may take.
    """

    def __init__(self, timeout: datetime.timedelta = datetime.timedelta(seconds=30)) -> None:
        self.timeout = timeout

    def __call__(self, state: FrozenState) -> FrozenState:
        """Synchronize the current device in a thread, under the deadline."""
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return state
        device = torch.cuda.current_device()
        thread = threading.Thread(
            target=torch.cuda.synchronize, args=(device,), name="inprocess-cuda-check", daemon=True
        )
        thread.start()
        thread.join(self.timeout.total_seconds())
        if thread.is_alive():
            raise TimeoutError(
                f"rank {state.rank}: torch.cuda.synchronize(cuda:{device}) did not return within "
                f"{self.timeout.total_seconds():g} s: the device looks hung"
            )
        torch.cuda.synchronize(device)  # raises if the context is broken
        return state


class FaultCounterExceeded(RestartError):  # noqa: N818 - NVRx's name
    """This rank caused more faults than ``FaultCounter(max_rank_faults)`` allows."""


class FaultCounter(HealthCheck):
    """Count the faults this rank caused; past ``max_rank_faults`` it leaves the job.

    Args:
        max_rank_faults: how many faults a rank may cause; None for no limit.
    """

    def __init__(self, max_rank_faults: int | None = None) -> None:
        self.max_rank_faults = max_rank_faults
        self.faults_count = 0

    def __call__(self, state: FrozenState) -> FrozenState:
        """Count the previous iteration's exception, if this rank raised one."""
        if state.fn_exception is None:
            return state
        self.faults_count += 1
        if self.max_rank_faults is not None and self.faults_count > self.max_rank_faults:
            raise FaultCounterExceeded(
                f"rank {state.rank}: {self.faults_count} faults, more than "
                f"max_rank_faults={self.max_rank_faults}; this rank leaves the job"
            )
        return state


def local_gpu_index() -> int | None:
    """NVML's index of this rank's GPU: ``LOCAL_RANK``, through ``CUDA_VISIBLE_DEVICES`` when
    that lists indices (Slurm's half-node jobs: ``4,5,6,7``); None without ``LOCAL_RANK``."""
    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.isdigit():
        return None
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if int(local) < len(visible) and all(d.isdigit() for d in visible):
        return int(visible[int(local)])
    return int(local)  # no list, or GPU UUIDs: NVML's order is taken as CUDA's


class _NvmlCheck(HealthCheck):
    """A check of one GPU through NVML (ft-core's ``GpuProbe``, opened at the first call and
    kept open); without NVML (no ``nvidia-ml-py``, no driver: a CPU job) it passes.

    Args:
        device_index: NVML's index of the GPU (the Wrapper gives ``local_gpu_index()``).
    """

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._probe = GpuProbe()
        self._unchecked_said = False

    def _opened(self) -> GpuProbe | None:
        """The probe, open, with this check's GPU in it; else None (logged once)."""
        if not self._probe.open():
            return None  # the probe logged why, once
        if self.device_index >= self._probe.count:
            if not self._unchecked_said:
                self._unchecked_said = True
                log.warning(
                    "%s: NVML sees %d GPU(s), none with index %d; this check is skipped "
                    "(is LOCAL_RANK or CUDA_VISIBLE_DEVICES wrong?)",
                    *(type(self).__name__, self._probe.count, self.device_index),
                )
            return None
        return self._probe


class ChainedGPUHealthCheck(_NvmlCheck):
    """Take this rank out of the job when its GPU cannot be trusted any more: NVML asks for a
    recovery action (a reset, a reboot, a drain: driver r570+), the GPU does not answer, its
    row remapper failed or retired pages wait for a reset. NVRx 0.5's name."""

    def __call__(self, state: FrozenState) -> FrozenState:
        """Raise ``HealthCheckError`` naming the GPU and what it needs; else return ``state``."""
        probe = self._opened()
        if probe is None:
            return state
        health = probe.health(self.device_index)
        problems = [
            *([f"NVML cannot reach it ({health.error})"] if health.error else []),
            *([f"the driver asks for {health.recovery_action}"] if health.recovery_action else []),
            *(["its row remapper failed"] if health.row_remap_failed else []),
            *(["retired pages wait for a reset"] if health.retired_pages_pending else []),
        ]
        if problems:
            raise HealthCheckError(
                f"rank {state.rank}: GPU {self.device_index} (NVML index) is not healthy: "
                f"{'; '.join(problems)}. This rank leaves the job; recover the GPU (nvidia-smi "
                "-q shows its state) before it trains again"
            )
        return state


class ChainedNVLHealthCheck(_NvmlCheck):
    """Report the NVLinks of this rank's GPU that are down, and go on: NCCL routes around a
    lost link or fails with its own error, so a link alone does not take the rank out (NVRx's
    own tests call its NVLink failure "ignored"). NVRx 0.5's name."""

    def __call__(self, state: FrozenState) -> FrozenState:
        """Log a warning naming the links that are down; return ``state``."""
        probe = self._opened()
        down = () if probe is None else probe.nvlinks_down(self.device_index)
        if down:
            log.warning(
                "rank %s: GPU %d: NVLink(s) %s down; the restart goes on (collectives may be "
                "slower, or NCCL may fail on them); check `nvidia-smi nvlink --status`",
                *(state.rank, self.device_index, list(down)),
            )
        return state
