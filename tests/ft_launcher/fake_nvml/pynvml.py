"""A fake ``pynvml`` (nvidia-ml-py) for the launcher's GPU health check on machines without a GPU.

It keeps the rules of real NVML that the check depends on: every call but ``nvmlInit`` needs an
open reference (``nvmlInit`` / ``nvmlShutdown`` count), an event set receives only the XIDs raised
while it is registered, and ``nvmlEventSetWait`` raises ``NVMLError_Timeout`` when nothing is
pending. Tests drive it in process (``configure``, ``set_ecc``, ``raise_xid``); a launcher
subprocess reads its starting state from the JSON file named by ``FAKE_PYNVML_STATE``::

    {"count": 2, "ecc": {"1": 3}, "xid": {"0": [79]}, "no_driver": false}

where the ``xid`` entries are raised on a GPU as soon as an event set is registered on it.
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


class NVMLError(Exception):
    """The binding's base error."""


class NVMLError_Timeout(NVMLError):
    """No event arrived within the wait."""


class NVMLError_Uninitialized(NVMLError):
    """A call without an open ``nvmlInit`` reference."""


class NVMLError_NotSupported(NVMLError):
    """The GPU does not support the query."""


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class _Gpu:
    ecc: int | None = 0  # None: ECC is off on this board (the query is not supported)
    pending_xids: list[int] = field(default_factory=list)  # raised when a set registers


@dataclass
class _EventSet:
    devices: set[int] = field(default_factory=set)
    queue: list[SimpleNamespace] = field(default_factory=list)
    freed: bool = False


_gpus: list[_Gpu] = []
_sets: list[_EventSet] = []
_refs = 0
_no_driver = False


def configure(count: int = 1, no_driver: bool = False) -> None:
    """Start over with ``count`` healthy GPUs (or with no driver)."""
    global _refs, _no_driver
    _gpus[:] = [_Gpu() for _ in range(count)]
    _sets.clear()
    _refs = 0
    _no_driver = no_driver


def set_ecc(index: int, count: int | None) -> None:
    """Set GPU ``index``'s volatile uncorrectable ECC count (None: ECC not supported)."""
    _gpus[index].ecc = count


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


def _load_state() -> None:
    path = os.environ.get("FAKE_PYNVML_STATE")
    if not path:
        configure(1)
        return
    with open(path, encoding="utf-8") as fh:
        state: dict[str, Any] = json.load(fh)
    configure(int(state.get("count", 1)), bool(state.get("no_driver", False)))
    for index, count in state.get("ecc", {}).items():
        set_ecc(int(index), count)
    for index, xids in state.get("xid", {}).items():
        _gpus[int(index)].pending_xids.extend(int(x) for x in xids)


def _need_init() -> None:
    if _refs <= 0:
        raise NVMLError_Uninitialized("Uninitialized")


def _gpu(handle: _Handle) -> _Gpu:
    _need_init()
    return _gpus[handle.index]


def nvmlInit() -> None:
    global _refs
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


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> SimpleNamespace:
    _gpu(handle)
    return SimpleNamespace(total=80 << 30, free=80 << 30, used=0)


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    gpu = _gpu(handle)
    if (error_type, counter_type) != (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC):
        return 0  # the check asks for the uncorrected volatile counter; others stay clean
    if gpu.ecc is None:
        raise NVMLError_NotSupported("Not Supported")
    return gpu.ecc


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    _gpu(handle)
    return 0


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    _gpu(handle)
    return (0, 0, 0, 0)


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


_load_state()
