"""Bad configuration stops ft-launcher before any monitor or worker starts, naming the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_harness import WORKER


def _run(
    args: list[str], marker_dir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "resiliency.launcher",
            "--nproc-per-node",
            "2",
            *args,
            str(WORKER),
            "--marker-dir",
            str(marker_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def test_yaml_typo_names_the_closest_key(tmp_path: Path, marker_dir: Path):
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("fault_tolerance:\n  rank_heartbeat_timout: 10\n")
    proc = _run(["--ft-cfg-path", str(cfg)], marker_dir)
    assert proc.returncode == 2
    assert "rank_heartbeat_timeout" in proc.stderr and "rank_heartbeat_timout" in proc.stderr
    assert list(marker_dir.iterdir()) == []  # no worker ever started
    assert "rank monitor" not in proc.stderr


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--ft-rank-heartbeat-timeout", "-3"], "--ft-rank-heartbeat-timeout"),
        (["--ft-rank-heartbeat-timout", "3"], "--ft-rank-heartbeat-timeout"),
        (["--restart-policy", "most-healthy"], "min-healthy"),
        (["--term-timeout", "100000"], "--term-timeout"),
        (["--term-timeout", "soon"], "--term-timeout"),
        (["--node-health-check-fn", "no_such_module_xyz:check"], "no_such_module_xyz"),
        (["--ft-preimport", "torch,not a module"], "--ft-preimport"),
        # Issue 30, item 9: the launcher's own flag, not an NVRx key that has no effect here.
        (["--ft-restart-polcy", "min-healthy"], "did you mean --ft-restart-policy?"),
        (["--ft-preimprt", "torch"], "did you mean --ft-preimport?"),
        (
            ["--ft-restart-check-intervl", "3"],
            "did you mean --ft-restart-check-interval? (a setting of NVIDIA's resiliency "
            "extension; no effect here)",
        ),
    ],
)
def test_bad_flag_stops_before_any_worker(marker_dir: Path, flags: list[str], needle: str):
    proc = _run(flags, marker_dir)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert list(marker_dir.iterdir()) == []


def test_help_shows_one_fault_tolerance_group():
    proc = subprocess.run(
        [sys.executable, "-m", "resiliency.launcher", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text = proc.stdout
    assert text.count("fault tolerance:") == 1
    group = text.split("fault tolerance:", 1)[1]
    for flag in (
        "--ft-cfg-path",
        "--ft-param-rank_heartbeat_timeout",
        "--ft-rank-heartbeat-timeout",
        "--restart-policy",
        "--ft-restart-policy",
        "--term-timeout",
        "--workers-stop-timeout",
        "--node-health-check-cmd",
    ):
        assert flag in group, flag
    assert "--nnodes" in text and "--rdzv-backend" in text  # torchrun's own flags


def test_failed_health_check_keeps_the_node_out(marker_dir: Path):
    proc = _run(["--node-health-check-cmd", f"{sys.executable} -c 'exit(\"bad gpu\")'"], marker_dir)
    assert proc.returncode == 4, proc.stderr
    assert "node health check failed" in proc.stderr and "bad gpu" in proc.stderr
    assert list(marker_dir.iterdir()) == []


def test_too_long_tmpdir_stops_before_any_worker(tmp_path: Path, marker_dir: Path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    proc = _run([], marker_dir, env={"TMPDIR": str(deep)})
    assert proc.returncode == 2, proc.stderr
    assert "Set TMPDIR to a shorter directory" in proc.stderr
    assert list(marker_dir.iterdir()) == []
    assert list(deep.iterdir()) == []  # no socket directory was created
