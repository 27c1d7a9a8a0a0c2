"""One NVML probe for every reader of GPU health: the launcher's check, the supervisor's sensor.

NVML comes from ``nvidia-ml-py`` (imported as ``pynvml``), an optional dependency of the
packages that use this module; without it, or without a driver, the probe says why and reads
nothing. It holds one NVML reference from :meth:`GpuProbe.open` to :meth:`GpuProbe.close`,
because NVML delivers an XID only to event sets registered when it happens: the probe
registers one event set per GPU at open and every :meth:`GpuProbe.drain_xids` returns what
arrived since. One set per GPU also tells the GPU of an event without comparing device
handles, which pynvml returns as new ctypes objects that never compare equal.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["CRITICAL_XIDS", "GpuHealth", "GpuProbe", "XidEvent"]

logger = logging.getLogger(__name__)

#: XIDs after which a GPU (its memory, its row remapper, its NVLink or its bus link) cannot be
#: trusted until it is reset: double-bit ECC (48), row-remap failure (63, 64), NVLink (74), fell
#: off the bus (79), high single-bit ECC rate (92), contained / uncontained ECC (94, 95), GSP
#: errors (119, 120). Other XIDs (13, 31, 43: a fault of the application, not of the GPU) must
#: not take a node out of the job: a job's bug would otherwise empty the job of nodes.
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

# NVML's clock-throttle reason bits (the binding's names, and their values where it lacks them).
_THROTTLE_BITS = {
    "power": ("nvmlClocksThrottleReasonSwPowerCap", 0x4),
    "hw_slowdown": ("nvmlClocksThrottleReasonHwSlowdown", 0x8),
    "thermal": ("nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
    "hw_thermal": ("nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
    "power_brake": ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
}

# NVML's GPU recovery actions (r570+; the binding's NVML_GPU_RECOVERY_ACTION_* values).
_RECOVERY_ACTIONS = {1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health as NVML reports it now.

    Attributes:
        index: the NVML device index.
        error: why the GPU could not be opened (None when it answered).
        ecc_uncorrectable: volatile uncorrectable ECC errors since the driver loaded (0 where the
            board has no ECC).
        retired_pages_pending: pages wait for retirement: the GPU needs a reset.
        row_remap_failed: the row remapper ran out of spare rows.
        throttle: the clock-throttle reasons active now ("power", "thermal", ...).
        recovery_action: what the driver says the GPU needs before it can be trusted again
            ("gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"); None when nothing,
            or when the driver (older than r570) or the binding has no GPU recovery API.
    """

    index: int
    error: str | None = None
    ecc_uncorrectable: int = 0
    retired_pages_pending: bool = False
    row_remap_failed: bool = False
    throttle: tuple[str, ...] = ()
    recovery_action: str | None = None


@dataclass(frozen=True)
class XidEvent:
    """An XID error a GPU raised."""

    index: int
    xid: int


class GpuProbe:
    """NVML, opened once: device handles, one XID event set per GPU, health queries.

    Never raises for a missing binding, a missing driver or an unsupported query: ``state``
    says what happened and ``note`` why. Safe to use from several threads.

    Attributes:
        state: "closed" before :meth:`open`, then "ok", "missing" (no nvidia-ml-py),
            "no_driver" (``nvmlInit`` failed) or "failed" (the driver answered ``nvmlInit``
            but not the device count: not a node to train on).
        note: why the probe is not "ok" (None when it is).
    """

    def __init__(self) -> None:
        self.state = "closed"
        self.note: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._event_sets: dict[int, Any] = {}
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """The number of GPUs NVML sees (0 unless the probe is open)."""
        return len(self._handles)

    def open(self) -> bool:
        """Open NVML and register the XID event sets, unless already open; True when open.

        A probe that could not open tries again on the next call (a driver may come up later).
        """
        with self._lock:
            if self._nvml is not None:
                return True
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                self._fail(
                    "missing",
                    "nvidia-ml-py is not installed (the 'gpu' extra: pip install nvidia-ml-py)",
                )
                return False
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                self._fail("no_driver", f"no NVIDIA driver ({exc})")
                return False
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except nvml.NVMLError as exc:
                self._shutdown(nvml)
                self._fail("failed", f"NVML query failed ({exc})")
                return False
            self._nvml = nvml
            self._handles = []
            for index in range(count):
                try:
                    self._handles.append(nvml.nvmlDeviceGetHandleByIndex(index))
                except nvml.NVMLError as exc:
                    logger.debug("GPU %d: no handle: %s", index, exc)
                    self._handles.append(None)
            self._register_xid_sets(nvml)
            self.state, self.note = "ok", None
            return True

    def _fail(self, state: str, note: str) -> None:
        if (self.state, self.note) != (state, note):
            logger.info("GPU probe off: %s", note)
        self.state, self.note = state, note

    def _register_xid_sets(self, nvml: Any) -> None:
        for index, handle in enumerate(self._handles):
            if handle is None:
                continue
            try:
                event_set = nvml.nvmlEventSetCreate()
            except nvml.NVMLError as exc:
                logger.debug("GPU %d: no XID event set: %s", index, exc)
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except nvml.NVMLError as exc:
                logger.debug("GPU %d: XID events not supported: %s", index, exc)
                nvml.nvmlEventSetFree(event_set)
                continue
            self._event_sets[index] = event_set

    def health(self, index: int) -> GpuHealth:
        """Read GPU ``index``'s health now; queries the board does not support are skipped."""
        nvml = self._nvml
        if nvml is None:
            return GpuHealth(index, error=self.note or "the GPU probe is not open")
        handle = self._handles[index]
        try:
            if handle is None:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as exc:
            return GpuHealth(index, error=f"not accessible ({exc})")
        return GpuHealth(
            index,
            ecc_uncorrectable=int(
                self._query(
                    index,
                    "ECC",
                    0,
                    nvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            ),
            retired_pages_pending=bool(
                self._query(
                    index, "retired pages", 0, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle
                )
            ),
            row_remap_failed=self._row_remap_failed(index, handle),
            throttle=self._throttle(index, handle),
            recovery_action=self._recovery_action(index, handle),
        )

    def _query(self, index: int, what: str, default: Any, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            logger.debug("GPU %d: %s query not supported: %s", index, what, exc)
            return default

    def _row_remap_failed(self, index: int, handle: Any) -> bool:
        getter = self._nvml.nvmlDeviceGetRemappedRows
        remap = self._query(index, "remapped rows", (), getter, handle)
        return len(remap) >= 4 and bool(remap[3])

    def _throttle(self, index: int, handle: Any) -> tuple[str, ...]:
        nvml = self._nvml
        getter = getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = int(self._query(index, "throttle", 0, getter, handle)) if getter else 0
        bits = {name: int(getattr(nvml, attr, bit)) for name, (attr, bit) in _THROTTLE_BITS.items()}
        return tuple(name for name, bit in bits.items() if mask & bit)

    def _recovery_action(self, index: int, handle: Any) -> str | None:
        nvml = self._nvml
        field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:  # a binding older than the API
            return None
        values = self._query(
            index, "recovery action", (), nvml.nvmlDeviceGetFieldValues, handle, [field]
        )
        if not values or values[0].nvmlReturn != getattr(nvml, "NVML_SUCCESS", 0):
            return None  # a driver older than r570 answers the field with an error
        action = int(values[0].value.uiVal)
        if action == getattr(nvml, "NVML_GPU_RECOVERY_ACTION_NONE", 0):
            return None
        return _RECOVERY_ACTIONS.get(action, f"unknown ({action})")

    def nvlinks_down(self, index: int) -> tuple[int, ...]:
        """The NVLinks of GPU ``index`` that NVML reports disabled (none without NVML).

        Read on demand, not in :meth:`health`: up to 18 queries per GPU that the periodic
        readers of health do not need. Links are numbered from 0; the first one NVML refuses
        ends the list (the GPU has no more).
        """
        nvml = self._nvml
        getter = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        if nvml is None or getter is None:
            return ()
        disabled = getattr(nvml, "NVML_FEATURE_DISABLED", 0)
        down = []
        try:
            handle = self._handles[index] or nvml.nvmlDeviceGetHandleByIndex(index)
            for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                if getter(handle, link) == disabled:
                    down.append(link)
        except nvml.NVMLError as exc:  # past the GPU's last link, or no NVLink at all
            logger.debug("GPU %d: NVLink state read stops: %s", index, exc)
        return tuple(down)

    def drain_xids(self, wait_ms: int = 0, max_per_gpu: int = 64) -> list[XidEvent]:
        """The XIDs every GPU raised since the last drain (at most ``max_per_gpu`` each).

        Args:
            wait_ms: how long to wait on each GPU for a further event.
            max_per_gpu: bound on the events taken from one GPU, so an XID storm cannot hold
                the caller; the rest stay queued for the next drain.
        """
        events: list[XidEvent] = []
        with self._lock:
            nvml = self._nvml
            if nvml is None:
                return events
            for index, event_set in self._event_sets.items():
                for _ in range(max_per_gpu):
                    try:
                        event = nvml.nvmlEventSetWait(event_set, wait_ms)
                    except nvml.NVMLError:  # NVMLError_Timeout: nothing pending
                        break
                    events.append(XidEvent(index, int(event.eventData)))
        return events

    def close(self) -> None:
        """Free the event sets and release the NVML reference (the probe may open again)."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            for event_set in self._event_sets.values():
                try:
                    nvml.nvmlEventSetFree(event_set)
                except nvml.NVMLError as exc:
                    logger.debug("nvmlEventSetFree failed: %s", exc)
            self._event_sets.clear()
            self._handles = []
            self._shutdown(nvml)
            self.state = "closed"

    @staticmethod
    def _shutdown(nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            logger.warning("nvmlShutdown failed: %s", exc)
