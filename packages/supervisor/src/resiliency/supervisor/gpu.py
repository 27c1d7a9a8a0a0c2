"""GPU health watchdogs for the node sensor: uncorrectable ECC, XID, throttling.

NVML is read through ft-core's :class:`~resiliency.ft.GpuProbe` (``nvidia-ml-py``, the 'gpu'
extra). Skipped cleanly without the library or a driver: :class:`GpuWatch` then reports no
devices and says why in :attr:`GpuWatch.note` (logged once).
"""

from __future__ import annotations

import logging

from resiliency.ft import CRITICAL_XIDS, GpuProbe
from resiliency.supervisor.document import GpuDevice

__all__ = ["CRITICAL_XIDS", "GpuWatch"]

logger = logging.getLogger(__name__)

# XIDs kept per GPU in a status document (the most recent ones).
_XIDS_KEPT = 16


class GpuWatch:
    """Reads every GPU's health on each :meth:`sample`.

    XID events arrive through the probe's event sets, registered once when the watch starts;
    ECC counts and throttle reasons are read on each sample.
    """

    def __init__(self) -> None:
        self._probe = GpuProbe()
        self.note: str | None = None
        self._xids: dict[int, list[int]] = {}
        if not self._probe.open():
            self.note = f"GPU watchdogs off: NVML not available: {self._probe.note}"
            logger.info("%s", self.note)
            return
        self._xids = {i: [] for i in range(self._probe.count)}

    @property
    def available(self) -> bool:
        """True when NVML answered."""
        return self._probe.state == "ok"

    def sample(self) -> list[GpuDevice]:
        """Return every GPU's health now (empty without NVML)."""
        if not self.available:
            return []
        for event in self._probe.drain_xids():
            kept = self._xids.setdefault(event.index, [])
            kept.append(event.xid)
            del kept[:-_XIDS_KEPT]
        devices = []
        for index in range(self._probe.count):
            health = self._probe.health(index)
            devices.append(
                GpuDevice(
                    index,
                    health.ecc_uncorrectable,
                    list(self._xids.get(index, [])),
                    list(health.throttle),
                )
            )
        return devices

    def close(self) -> None:
        """Release NVML."""
        self._probe.close()
