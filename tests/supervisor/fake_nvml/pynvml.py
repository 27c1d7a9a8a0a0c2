"""A fake ``pynvml`` for tests on machines without a GPU.

Its state is a JSON file named by ``FAKE_NVML_STATE``:
``{"count": N, "ecc": {"0": 2}, "xid": {"0": [79]}, "throttle": {"0": 64}}``; it is re-read on
every call, so a test (or another process) changes the GPUs' health by rewriting the file.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 8
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


_delivered: dict[int, int] = {}


def _state() -> dict:
    with open(os.environ["FAKE_NVML_STATE"]) as fh:
        return json.load(fh)


def nvmlInit() -> None:
    if _state().get("no_driver"):
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return int(_state().get("count", 1))


class _Handle:
    """A device handle: like pynvml's ctypes pointers, two handles of one GPU are not equal
    (``==`` compares the Python objects), so code must not match an event's device by ``==``."""

    def __init__(self, index: int) -> None:
        self.index = index


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    return _Handle(index)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return handle.index


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter: int) -> int:
    return int(_state().get("ecc", {}).get(str(handle.index), 0))


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    return int(_state().get("throttle", {}).get(str(handle.index), 0))


def nvmlEventSetCreate() -> object:
    return object()


def nvmlDeviceRegisterEvents(handle: _Handle, types: int, event_set: object) -> None:
    return None


def nvmlEventSetWait(event_set: object, timeout_ms: int) -> SimpleNamespace:
    for device, xids in _state().get("xid", {}).items():
        done = _delivered.get(int(device), 0)
        if done < len(xids):
            _delivered[int(device)] = done + 1
            # A new handle object for the device, as NVML's event data carries.
            return SimpleNamespace(device=_Handle(int(device)), eventData=xids[done])
    raise NVMLError_Timeout("timeout")


def nvmlEventSetFree(event_set: object) -> None:
    return None
