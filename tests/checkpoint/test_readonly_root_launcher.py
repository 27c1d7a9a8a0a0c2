"""A rank that ends with the config-error exit code (a checkpoint directory on a real read-only
mount): ft-launcher stops the job with exit code 2 instead of restarting it. Needs ft-launcher:
runs in the `integration` session.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from readonly_mount import WORKER, in_mount, make_dirs, needs_namespaces, running

from resiliency.checkpoint import CONFIG_ERROR_EXIT_CODE

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return make_dirs(tmp_path)


@needs_namespaces
@pytest.mark.parametrize("fork_server", [False, True], ids=["exec", "fork-server"])
def test_ft_launcher_stops_without_restarting_and_exits_2(
    dirs: tuple[Path, Path], tmp_path: Path, fork_server: bool
) -> None:
    root, markers = dirs
    status = tmp_path / "status.json"
    launcher = [sys.executable, "-m", "resiliency.launcher", "--nproc-per-node", "2"]
    launcher += ["--max-restarts", "3", "--monitor-interval", "0.1", "--no-gpu-health-check"]
    launcher += ["--exit-status-file", str(status), "--rdzv-endpoint", "127.0.0.1:0"]
    launcher += ["--ft-preimport", "resiliency.checkpoint"] if fork_server else []
    launcher += [str(WORKER), str(root), str(markers), "uncaught"]
    log = tmp_path / "launcher.log"
    with running(in_mount(root, "ro", launcher), log) as proc:
        code = proc.wait(timeout=150)
    text = log.read_text(errors="replace")
    assert code == 2, text[-6000:]
    # One attempt and no restart (a rank still importing when the other failed is stopped
    # before its marker).
    started = {p.name for p in markers.iterdir()}
    assert started and started <= {"start-0-0", "start-1-0"}, (started, text[-6000:])
    assert "restarting the worker group" not in text
    verdict = json.loads(status.read_text())
    assert verdict["exit_code"] == 2 and verdict["reason"] == "worker_config_error"
    assert f"exited {CONFIG_ERROR_EXIT_CODE}: a configuration error" in verdict["detail"]
    assert str(root.resolve()) in text and "Read-only file system" in text  # the rank's error


def test_the_rank_and_the_launcher_agree_on_the_config_error_code() -> None:
    launcher_side = pytest.importorskip(
        "resiliency.launcher._config_error",
        reason="the launcher's side needs resiliency-ft-launcher",
    )
    assert launcher_side.CONFIG_ERROR_EXIT_CODE == CONFIG_ERROR_EXIT_CODE == 78  # EX_CONFIG
