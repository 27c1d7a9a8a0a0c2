"""The NVML GPU health check against a fake ``pynvml``: healthy, ECC errors, XIDs, no driver.

The fake (tests/fake_nvml/pynvml.py) keeps real NVML's rules that matter here: calls need an open
``nvmlInit`` reference, and an event set only receives XIDs raised while it is registered.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fake_nvml_module import FAKE_DIR, load_fake_pynvml
from launcher_harness import WORKER

from resiliency.launcher.health import CRITICAL_XIDS, NvmlGpuHealthCheck


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh fake ``pynvml`` with two healthy GPUs, imported by the check as ``pynvml``."""
    return load_fake_pynvml(monkeypatch)


def test_healthy_gpus_pass_and_nvml_references_are_balanced(nvml: ModuleType) -> None:
    check = NvmlGpuHealthCheck()
    for _ in range(2):
        result = check()
        assert result.healthy and not result.skipped, result
        assert result.detail == "2 GPU(s) healthy"
    # Only the reference that keeps the XID event sets alive stays open between runs.
    assert nvml.open_references() == 1 and nvml.live_event_sets() == 2
    check.close()
    assert nvml.open_references() == 0 and nvml.live_event_sets() == 0


def test_uncorrectable_ecc_errors_fail_naming_the_gpu(nvml: ModuleType) -> None:
    check = NvmlGpuHealthCheck()
    nvml.set_ecc(1, 3)
    result = check()
    assert not result.healthy and not result.skipped
    assert "GPU 1: 3 uncorrectable ECC error(s)" in result.detail
    assert "GPU 0" not in result.detail
    nvml.set_ecc(1, 0)  # the volatile counter starts over after a GPU reset
    assert check().healthy


def test_a_board_without_ecc_is_not_unhealthy(nvml: ModuleType) -> None:
    nvml.set_ecc(0, None)
    assert NvmlGpuHealthCheck()().healthy


def test_a_critical_xid_between_runs_fails_and_stays_failed(nvml: ModuleType) -> None:
    check = NvmlGpuHealthCheck()
    assert check().healthy  # registers the event sets
    nvml.raise_xid(0, 79)
    result = check()
    assert not result.healthy
    assert "GPU 0: critical XID 79" in result.detail and "GPU 1" not in result.detail
    # The GPU needs a reset: later runs, with no new event, still fail.
    assert not check().healthy
    nvml.raise_xid(0, 48)
    assert "GPU 0: critical XID 48, 79" in check().detail


def test_a_non_critical_xid_is_logged_and_leaves_the_node_healthy(
    nvml: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    assert 13 not in CRITICAL_XIDS
    check = NvmlGpuHealthCheck()
    check()
    nvml.raise_xid(1, 13)
    with caplog.at_level(logging.WARNING, logger="resiliency.launcher.health"):
        assert check().healthy
    assert any("GPU 1 raised XID 13" in r.getMessage() for r in caplog.records)


def test_the_critical_xid_list_can_be_changed(nvml: ModuleType) -> None:
    check = NvmlGpuHealthCheck(critical_xids=frozenset({13}))
    check()
    nvml.raise_xid(1, 79)
    nvml.raise_xid(1, 13)
    result = check()
    assert not result.healthy and result.detail == "GPU 1: critical XID 13 (reset the GPU)"


def test_no_driver_is_skipped(nvml: ModuleType) -> None:
    nvml.configure(1, no_driver=True)
    result = NvmlGpuHealthCheck()()
    assert result.healthy and result.skipped and "no NVIDIA driver" in result.detail


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ({"count": 2, "ecc": {"1": 2}}, "GPU 1: 2 uncorrectable ECC error(s)"),
        ({"count": 1, "xid": {"0": [79]}}, "GPU 0: critical XID 79"),
    ],
    ids=["ecc", "xid"],
)
def test_launcher_with_an_unhealthy_gpu_keeps_the_node_out(
    tmp_path: Path, marker_dir: Path, state: dict[str, object], needle: str
) -> None:
    state_file = tmp_path / "nvml.json"
    state_file.write_text(json.dumps(state))
    pythonpath = os.pathsep.join(p for p in (str(FAKE_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "FAKE_NVML_STATE": str(state_file)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "resiliency.launcher",
            "--nproc-per-node",
            "1",
            str(WORKER),
            "--marker-dir",
            str(marker_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 4, proc.stderr[-4000:]  # exit 4: this node left the job
    assert f"node health check gpu (nvml) FAILED: {needle}" in proc.stderr
    assert "node health check failed" in proc.stderr
    assert list(marker_dir.iterdir()) == []  # no worker started
