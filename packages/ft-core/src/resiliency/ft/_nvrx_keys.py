"""Settings of NVIDIA's resiliency extension (NVRx) 0.4.x that this toolkit does not have.

They are accepted, so that a migrated YAML file or command line keeps working, and each one is
reported once per process with a warning saying that it has no effect here. A key that no
release of NVRx has stays an error (see :mod:`resiliency.ft.config`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("resiliency.ft.config")

#: NVRx 0.4.x ``FaultToleranceConfig`` fields without a counterpart here, and why.
NVRX_ONLY_KEYS: Mapping[str, str] = {
    "restart_check_interval": "the layered in-process/in-job restart protocol is not implemented",
    "enable_nic_monitor": "there is no NIC link monitor",
    "pci_topo_file": "there is no NIC link monitor",
    "link_down_path_template": "there is no NIC link monitor",
    "enable_rank_monitors": "the launcher always starts one rank monitor per local rank",
    "skip_section_response": "heartbeats and sections never wait for a response (always on)",
    "use_infra_group_rank": "ranks are assigned by torch's rendezvous, as with torchrun",
}

_warned: set[str] = set()
_lock = threading.Lock()


def drop_nvrx_only_keys(data: Mapping[Any, Any]) -> dict[Any, Any]:
    """Return ``data`` without the NVRx-only keys, warning once per process about each one.

    Args:
        data: settings by name.

    Returns:
        A copy without the keys of :data:`NVRX_ONLY_KEYS`.
    """
    kept = {}
    for key, value in data.items():
        reason = NVRX_ONLY_KEYS.get(key) if isinstance(key, str) else None
        if reason is None:
            kept[key] = value
            continue
        with _lock:
            first = key not in _warned
            _warned.add(key)
        if first:
            logger.warning(
                "fault-tolerance setting %r (= %r) is a setting of NVIDIA's resiliency extension "
                "that has no effect here: %s; it is ignored "
                "(docs/coming_from_nvidia_resiliency_ext.md)",
                key,
                value,
                reason,
            )
    return kept
