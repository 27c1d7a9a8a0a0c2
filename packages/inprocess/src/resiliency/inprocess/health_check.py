"""Health checks: decide, after a fault, whether this rank may take part in the restart."""

from __future__ import annotations

import abc
import datetime
import logging
import threading

import torch

from resiliency.inprocess.exception import RestartError, TimeoutError
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
