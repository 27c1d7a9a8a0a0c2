"""A checkpoint directory on a read-only file system (a real read-only mount, which stops root
too): refused when the manager is built, with the directory named; uncaught, the rank exits 78;
a save that fails later names the directory. ft-launcher's side: test_readonly_root_launcher.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from readonly_mount import WORKER, in_mount, make_dirs, needs_namespaces

from resiliency.checkpoint import CONFIG_ERROR_EXIT_CODE

pytestmark = pytest.mark.timeout(180)

ERRNO_EROFS = 30


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return make_dirs(tmp_path)


@needs_namespaces
@pytest.mark.parametrize("mode", ["caught", "local"], ids=["root", "local-tier"])
def test_construction_names_the_directory_and_the_reason(
    dirs: tuple[Path, Path], mode: str
) -> None:
    root, markers = dirs
    cmd = in_mount(root, "ro", [sys.executable, str(WORKER), str(root), str(markers), mode])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["type"] == "CheckpointDirNotWritableError"
    assert report["path"] == str(root.resolve()) and report["errno"] == ERRNO_EROFS
    message = report["message"]
    assert str(root.resolve()) in message and "Read-only file system" in message
    assert "rank 0" in message and "start the job again" in message
    assert f"exit code {CONFIG_ERROR_EXIT_CODE}" in message


@needs_namespaces
def test_uncaught_it_ends_the_process_with_the_config_error_code(
    dirs: tuple[Path, Path],
) -> None:
    root, markers = dirs
    cmd = in_mount(root, "ro", [sys.executable, str(WORKER), str(root), str(markers), "uncaught"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == CONFIG_ERROR_EXIT_CODE, done.stderr
    assert "CheckpointDirNotWritableError" in done.stderr  # the traceback is still printed
    assert str(root.resolve()) in done.stderr
    assert f"exiting with code {CONFIG_ERROR_EXIT_CODE}" in done.stderr


@needs_namespaces
def test_a_save_that_fails_later_names_the_directory(dirs: tuple[Path, Path]) -> None:
    root, markers = dirs
    cmd = in_mount(root, "rw", [sys.executable, str(WORKER), str(root), str(markers), "remount"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["type"] == "SaveFailedError"
    assert str(root.resolve()) in report["message"] and "step 20" in report["message"]
