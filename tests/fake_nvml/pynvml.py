"""The one fake ``pynvml`` (nvidia-ml-py) of the tests, for machines without a GPU.

It keeps the rules of real NVML that the GPU probe (``resiliency.ft.gpu_probe``) depends on:
every call but ``nvmlInit`` needs an open reference (``nvmlInit`` / ``nvmlShutdown`` count), an
event set receives only the XIDs raised while it is registered, ``nvmlEventSetWait`` raises
``NVMLError_Timeout`` when nothing is pending, and two handles of one GPU never compare equal
(pynvml's handles are new ctypes objects), so nothing may match devices by ``==``.

Two ways to drive it:

* in process: ``configure``, ``set_ecc``, ``raise_xid``, then ``open_references`` and
  ``live_event_sets`` to check that references and event sets are balanced;
* through a JSON file named by ``FAKE_NVML_STATE``, re-read at every call, so a test or another
  process changes the GPUs' health by rewriting it::

    {"count": 2, "ecc": {"1": 3}, "xid": {"0": [79]}, "throttle": {"0": 64}, "no_driver": false,
     "recovery": {"0": 1}, "nvlink": {"1": [1, 1, 0, 1]}}

  ``recovery`` is NVML's GPU recovery action (0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain
  and reset); ``nvlink`` the state of each link the GPU has (1 enabled, 0 disabled: down).

  ``xid`` lists every XID a GPU has raised so far: an entry not seen before is raised when the
  file is read, and reaches the event sets registered on that GPU then, or the first one
  registered later (a node whose GPU failed before its launcher started).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 0x8
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 271
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4
NVML_NVLINK_MAX_LINKS = 18
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1


class NVMLError(Exception):
    """The binding's base error."""


class NVMLError_Timeout(NVMLError):
    """No event arrived within the wait."""


class NVMLError_Uninitialized(NVMLError):
    """A call without an open ``nvmlInit`` reference."""


class NVMLError_NotSupported(NVMLError):
    """The GPU does not support the query."""


class _Handle:
    """A device handle; like pynvml's, two handles of one GPU are different objects."""

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class _Gpu:
    ecc: int | None = 0  # None: ECC is off on this board (the query is not supported)
    throttle: int = 0
    recovery: int = 0  # NVML_GPU_RECOVERY_ACTION_*
    nvlinks: list[int] = field(default_factory=list)  # one state per link the GPU has
    pending_xids: list[int] = field(default_factory=list)  # raised before any set registered
    xids_read: int = 0  # entries of the state file's xid list already raised


@dataclass
class _EventSet:
    devices: set[int] = field(default_factory=set)
    queue: list[SimpleNamespace] = field(default_factory=list)
    freed: bool = False


_gpus: list[_Gpu] = []
_sets: list[_EventSet] = []
_refs = 0
_no_driver = False
_recovery_api = True  # a driver older than r570 answers the recovery field with an error


def configure(count: int = 1, no_driver: bool = False) -> None:
    """Start over with ``count`` healthy GPUs (or with no driver)."""
    global _refs, _no_driver
    _gpus[:] = [_Gpu() for _ in range(count)]
    _sets.clear()
    _refs = 0
    _no_driver = no_driver
    set_recovery_api(True)


def set_ecc(index: int, count: int | None) -> None:
    """Set GPU ``index``'s volatile uncorrectable ECC count (None: ECC not supported)."""
    _gpus[index].ecc = count


def set_recovery_api(available: bool) -> None:
    """Whether the driver has the GPU recovery API (r570 and newer)."""
    global _recovery_api
    _recovery_api = available


def set_recovery_action(index: int, action: int) -> None:
    """Set what the driver says GPU ``index`` needs (an ``NVML_GPU_RECOVERY_ACTION_*``)."""
    _gpus[index].recovery = action


def set_nvlinks(index: int, states: list[int]) -> None:
    """Give GPU ``index`` one link per entry, in that state (``NVML_FEATURE_*``)."""
    _gpus[index].nvlinks = list(states)


def raise_xid(index: int, xid: int) -> None:
    """GPU ``index`` raises ``xid`` now: every set registered on it receives the event."""
    for event_set in _sets:
        if index in event_set.devices and not event_set.freed:
            event_set.queue.append(SimpleNamespace(device=_Handle(index), eventData=xid))


def open_references() -> int:
    """``nvmlInit`` calls not yet matched by ``nvmlShutdown``."""
    return _refs


def live_event_sets() -> int:
    """Event sets created and not freed."""
    return sum(not s.freed for s in _sets)


def _sync() -> None:
    """Apply the state file, when there is one."""
    global _no_driver
    path = os.environ.get("FAKE_NVML_STATE")
    if not path:
        return
    with open(path, encoding="utf-8") as fh:
        state: dict[str, Any] = json.load(fh)
    count = int(state.get("count", 1))
    while len(_gpus) < count:
        _gpus.append(_Gpu())
    del _gpus[count:]
    _no_driver = bool(state.get("no_driver", False))
    for index, gpu in enumerate(_gpus):
        key = str(index)
        gpu.ecc = state.get("ecc", {}).get(key, 0)
        gpu.throttle = int(state.get("throttle", {}).get(key, 0))
        gpu.recovery = int(state.get("recovery", {}).get(key, 0))
        gpu.nvlinks = [int(x) for x in state.get("nvlink", {}).get(key, [])]
        xids = [int(x) for x in state.get("xid", {}).get(key, [])]
        for xid in xids[gpu.xids_read :]:
            if any(index in s.devices and not s.freed for s in _sets):
                raise_xid(index, xid)
            else:
                gpu.pending_xids.append(xid)
        gpu.xids_read = max(gpu.xids_read, len(xids))


def _need_init() -> None:
    _sync()
    if _refs <= 0:
        raise NVMLError_Uninitialized("Uninitialized")


def _gpu(handle: _Handle) -> _Gpu:
    _need_init()
    return _gpus[handle.index]


def nvmlInit() -> None:
    global _refs
    _sync()
    if _no_driver:
        raise NVMLError("Driver Not Loaded")
    _refs += 1


def nvmlShutdown() -> None:
    global _refs
    _need_init()
    _refs -= 1


def nvmlDeviceGetCount() -> int:
    _need_init()
    return len(_gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _need_init()
    if not 0 <= index < len(_gpus):
        raise NVMLError("Invalid Argument")
    return _Handle(index)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    _need_init()
    return handle.index


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> SimpleNamespace:
    _gpu(handle)
    return SimpleNamespace(total=80 << 30, free=80 << 30, used=0)


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    gpu = _gpu(handle)
    if (error_type, counter_type) != (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC):
        return 0  # the probe asks for the uncorrected volatile counter; others stay clean
    if gpu.ecc is None:
        raise NVMLError_NotSupported("Not Supported")
    return int(gpu.ecc)


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    _gpu(handle)
    return 0


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    _gpu(handle)
    return (0, 0, 0, 0)


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    return _gpu(handle).throttle


def nvmlDeviceGetFieldValues(handle: _Handle, field_ids: list[int]) -> list[SimpleNamespace]:
    gpu = _gpu(handle)
    values = []
    for field_id in field_ids:
        known = field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and _recovery_api
        values.append(
            SimpleNamespace(
                fieldId=field_id,
                nvmlReturn=NVML_SUCCESS if known else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=gpu.recovery if known else 0),
            )
        )
    return values


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    gpu = _gpu(handle)
    if link >= len(gpu.nvlinks):
        raise NVMLError_NotSupported("Not Supported")
    return gpu.nvlinks[link]


def nvmlEventSetCreate() -> _EventSet:
    _need_init()
    event_set = _EventSet()
    _sets.append(event_set)
    return event_set


def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: _EventSet) -> None:
    gpu = _gpu(handle)
    if event_set.freed:
        raise NVMLError("Invalid Argument")
    if event_types & nvmlEventTypeXidCriticalError:
        event_set.devices.add(handle.index)
        pending, gpu.pending_xids = gpu.pending_xids, []
        for xid in pending:
            raise_xid(handle.index, xid)


def nvmlEventSetWait(event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
    _need_init()
    if event_set.freed:
        raise NVMLError("Invalid Argument")
    if not event_set.queue:
        raise NVMLError_Timeout("Timeout")
    return event_set.queue.pop(0)


def nvmlEventSetFree(event_set: _EventSet) -> None:
    _need_init()
    event_set.freed = True


configure(1)
