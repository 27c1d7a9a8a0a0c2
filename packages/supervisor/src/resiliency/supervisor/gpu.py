"""GPU health watchdogs through NVML (``nvidia-ml-py``): uncorrectable ECC, XID, throttling.

Skipped cleanly without the library or a driver: :class:`GpuWatch` then reports no devices and
says why in :attr:`GpuWatch.note` (logged once).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from resiliency.supervisor.document import GpuDevice

__all__ = ["CRITICAL_XIDS", "GpuWatch"]

logger = logging.getLogger(__name__)

#: XIDs that mean the GPU (or its memory or bus link) cannot be trusted: double-bit ECC (48),
#: row-remap failure (63, 64), NVLink (74), fell off the bus (79), high single-bit rate (92),
#: contained / uncontained ECC (94, 95), GSP errors (119, 120).
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

_THROTTLE_BITS = {
    "power": ("nvmlClocksThrottleReasonSwPowerCap", 0x4),
    "hw_slowdown": ("nvmlClocksThrottleReasonHwSlowdown", 0x8),
    "thermal": ("nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
    "hw_thermal": ("nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
    "power_brake": ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
}


class GpuWatch:
    """Reads every GPU's health on each :meth:`sample`.

    XID events are collected through an NVML event set registered once per device; ECC counts
    and throttle reasons are read on each sample.
    """

    def __init__(self) -> None:
        self.note: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._events: Any = None
        self._xids: dict[int, list[int]] = {}
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.note = f"GPU watchdogs off: NVML not available ({type(exc).__name__}: {exc})"
            logger.info("%s", self.note)
            return
        self._nvml = nvml
        self._xids = {i: [] for i in range(len(self._handles))}
        try:
            self._events = nvml.nvmlEventSetCreate()
            for handle in self._handles:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._events
                )
        except Exception as exc:
            self._events = None
            logger.info("XID events not available: %s", exc)

    @property
    def available(self) -> bool:
        """True when NVML answered."""
        return self._nvml is not None

    def _drain_xids(self) -> None:
        nvml = self._nvml
        while self._events is not None:
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # NVMLError_Timeout: no event pending
                return
            index = self._index_of(event.device)
            self._xids.setdefault(index, []).append(int(event.eventData))
            del self._xids[index][:-16]

    def _index_of(self, handle: Any) -> int:
        # An event's device is a new ctypes pointer object: ``==`` with the handle kept from
        # nvmlDeviceGetHandleByIndex compares the objects, never the devices. Ask NVML.
        try:
            return int(self._nvml.nvmlDeviceGetIndex(handle))
        except Exception as exc:  # NVMLError: an event of a device that has gone
            logger.warning("XID event of an unknown GPU (%s); counted as GPU -1", exc)
            return -1

    def _throttle(self, handle: Any) -> list[str]:
        nvml = self._nvml
        try:
            mask = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        except Exception:
            return []
        return [
            name
            for name, (attr, bit) in _THROTTLE_BITS.items()
            if mask & int(getattr(nvml, attr, bit))
        ]

    def sample(self) -> list[GpuDevice]:
        """Return every GPU's health now (empty without NVML)."""
        if self._nvml is None:
            return []
        nvml = self._nvml
        self._drain_xids()
        devices = []
        for i, handle in enumerate(self._handles):
            try:
                ecc = int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                )
            except Exception:  # ECC not supported on this board
                ecc = 0
            devices.append(GpuDevice(i, ecc, list(self._xids.get(i, [])), self._throttle(handle)))
        return devices

    def close(self) -> None:
        """Release NVML."""
        if self._nvml is not None:
            try:
                if self._events is not None:
                    self._nvml.nvmlEventSetFree(self._events)
                self._nvml.nvmlShutdown()
            except Exception as exc:
                logger.debug("NVML shutdown: %s", exc)
            self._nvml = None
