"""``autoresume=True`` with no finished-flag path is a configuration error: the rank exits 78 and
ft-launcher stops the job with exit code 2 (fix the configuration), restarting nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from lightning_flavour import MODULE
from ptl_harness import EXAMPLES, Jobs

from resiliency.checkpoint import CONFIG_ERROR_EXIT_CODE
from resiliency.ptl.autoresume import FINISHED_FLAG_ENV

TRAIN = EXAMPLES / "ptl_train.py"


def _ft_launcher() -> str:
    path = shutil.which("ft-launcher") or str(Path(sys.executable).with_name("ft-launcher"))
    if not Path(path).exists():
        pytest.fail("the ft-launcher console script is not installed (resiliency-ft-launcher)")
    return path


def test_without_a_launcher_the_rank_exits_with_the_config_error_code(
    jobs: Jobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FINISHED_FLAG_ENV, raising=False)
    argv = [str(TRAIN), "--work-dir", str(tmp_path / "run"), "--autoresume", "--max-steps", "2"]
    code, out = jobs.run(argv, timeout=120)
    assert code == CONFIG_ERROR_EXIT_CODE, out[-6000:]
    assert "AutoResumeConfigError" in out and FINISHED_FLAG_ENV in out


def test_ft_launcher_exits_2_without_restarting(
    jobs: Jobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FINISHED_FLAG_ENV, raising=False)
    status = tmp_path / "status.json"
    code, out = jobs.run(
        [
            _ft_launcher(), "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
            "--monitor-interval", "0.1", "--no-gpu-health-check",
            # Workers forked from the launcher's pre-imported server, as the README runs it.
            "--ft-preimport", f"torch,{MODULE}",
            "--exit-status-file", str(status),
            str(TRAIN), "--work-dir", str(tmp_path / "run"), "--autoresume", "--max-steps", "2",
        ],
        timeout=180,
    )  # fmt: skip
    assert code == 2, out[-8000:]
    assert "restarting the worker group" not in out
    verdict = json.loads(status.read_text())
    assert (verdict["reason"], verdict["restarts"]) == ("worker_config_error", 0)
    assert f"exited {CONFIG_ERROR_EXIT_CODE}: a configuration error" in verdict["detail"]
    assert "AutoResumeConfigError" in out and FINISHED_FLAG_ENV in out
