"""ft-core's GPU probe against the tests' one fake ``pynvml`` (tests/fake_nvml/pynvml.py).

The fake keeps real NVML's rules the probe depends on: calls need an open reference, an event
set receives only the XIDs raised while it is registered, and device handles never compare equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fake_nvml_module import load_fake_pynvml

from resiliency.ft import CRITICAL_XIDS, GpuProbe, XidEvent


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh fake ``pynvml`` with two healthy GPUs, imported by the probe as ``pynvml``."""
    return load_fake_pynvml(monkeypatch)


def test_one_reference_and_one_event_set_per_gpu_from_open_to_close(nvml: ModuleType) -> None:
    probe = GpuProbe()
    assert probe.state == "closed" and probe.count == 0
    assert probe.open() and probe.open()  # idempotent
    assert (probe.state, probe.note, probe.count) == ("ok", None, 2)
    assert nvml.open_references() == 1 and nvml.live_event_sets() == 2
    probe.close()
    assert nvml.open_references() == 0 and nvml.live_event_sets() == 0
    assert probe.state == "closed"


def test_health_reads_ecc_and_a_board_without_ecc_is_clean(nvml: ModuleType) -> None:
    probe = GpuProbe()
    probe.open()
    nvml.set_ecc(1, 3)
    nvml.set_ecc(0, None)  # ECC off on this board: the query is not supported
    h0, h1 = probe.health(0), probe.health(1)
    assert (h0.error, h0.ecc_uncorrectable) == (None, 0)
    assert (h1.index, h1.ecc_uncorrectable, h1.retired_pages_pending) == (1, 3, False)
    probe.close()


def test_health_reads_the_recovery_action_and_the_nvlinks_are_read_on_demand(
    nvml: ModuleType,
) -> None:
    probe = GpuProbe()
    assert probe.nvlinks_down(0) == ()  # not open: nothing to read
    probe.open()
    assert probe.health(0).recovery_action is None
    assert probe.nvlinks_down(0) == ()  # a GPU without NVLink
    nvml.set_recovery_action(0, nvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    nvml.set_recovery_action(1, 7)  # a value newer than this probe
    nvml.set_nvlinks(1, [nvml.NVML_FEATURE_ENABLED, nvml.NVML_FEATURE_DISABLED] * 2)
    assert probe.health(0).recovery_action == "gpu_reset"
    assert probe.health(1).recovery_action == "unknown (7)"
    assert probe.nvlinks_down(1) == (1, 3)
    probe.close()


def test_a_binding_or_driver_without_the_recovery_api_reads_no_action(
    nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = GpuProbe()
    probe.open()
    nvml.set_recovery_action(0, nvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    assert probe.health(0).recovery_action == "node_reboot"
    # A driver older than r570 answers the field with an error status.
    nvml.set_recovery_api(False)
    assert probe.health(0).recovery_action is None
    # A binding older than the API lacks the field's name.
    monkeypatch.delattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    assert probe.health(0).recovery_action is None
    probe.close()


def test_xids_are_drained_per_gpu_in_order_and_bounded(nvml: ModuleType) -> None:
    probe = GpuProbe()
    probe.open()
    assert probe.drain_xids() == []
    nvml.raise_xid(1, 79)
    nvml.raise_xid(0, 13)
    nvml.raise_xid(1, 48)
    assert sorted(probe.drain_xids(), key=lambda e: e.index) == [
        XidEvent(0, 13),
        XidEvent(1, 79),
        XidEvent(1, 48),
    ]
    for _ in range(5):
        nvml.raise_xid(0, 31)
    assert len(probe.drain_xids(max_per_gpu=3)) == 3  # an XID storm cannot hold the caller
    assert len(probe.drain_xids()) == 2  # the rest waited for the next drain
    assert 79 in CRITICAL_XIDS and 13 not in CRITICAL_XIDS
    probe.close()


def test_without_the_binding_the_probe_is_off_and_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    probe = GpuProbe()
    assert not probe.open()
    assert probe.state == "missing" and "pip install nvidia-ml-py" in (probe.note or "")
    assert probe.drain_xids() == [] and probe.health(0).error == probe.note


def test_no_driver_then_a_driver_that_comes_up(
    nvml: ModuleType, tmp_path: Path, monkeypatch
) -> None:
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"no_driver": True}))
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    probe = GpuProbe()
    assert not probe.open()
    assert probe.state == "no_driver" and "Driver Not Loaded" in (probe.note or "")
    # the state file says a GPU raised XID 79 before anybody listened: the first set gets it
    state.write_text(json.dumps({"count": 1, "xid": {"0": [79]}, "throttle": {"0": 0x40}}))
    assert probe.open() and probe.state == "ok"
    assert probe.drain_xids() == [XidEvent(0, 79)]
    assert probe.health(0).throttle == ("hw_thermal",)
    state.write_text(json.dumps({"count": 1, "xid": {"0": [79, 94]}}))
    assert probe.drain_xids() == [XidEvent(0, 94)]  # a new entry of the file is a new XID
    probe.close()
    assert nvml.open_references() == 0


def test_a_driver_that_fails_the_device_count_is_a_failed_probe(
    nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> int:
        raise nvml.NVMLError("Unknown Error")

    monkeypatch.setattr(nvml, "nvmlDeviceGetCount", broken)
    probe = GpuProbe()
    assert not probe.open()
    assert probe.state == "failed" and probe.note == "NVML query failed (Unknown Error)"
    assert nvml.open_references() == 0  # the reference nvmlInit took was given back
