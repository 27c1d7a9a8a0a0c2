"""A checkpoint directory on a read-only file system (a real read-only mount, which stops root
too): refused when the manager is built, with the directory named; uncaught, the rank exits 78
and ft-launcher stops the job with exit code 2 instead of restarting it; a save that fails later
names the directory.

The mounts live in a private user and mount namespace (``unshare --user --map-root-user
--mount``), so the tests need no privilege and leave the machine's mounts alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from resiliency.checkpoint import CONFIG_ERROR_EXIT_CODE

pytestmark = pytest.mark.timeout(180)

WORKER = Path(__file__).with_name("readonly_root_worker.py")
REPO = Path(__file__).resolve().parents[2]
ERRNO_EROFS = 30


def _namespaces_work() -> str | None:
    """Why a private mount namespace cannot be made here, or None when it can."""
    if shutil.which("unshare") is None:
        return "no unshare(1) to make a private mount namespace"
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"unprivileged user and mount namespaces are disabled: {probe.stderr.strip()}"
    return None


_WHY_NOT = _namespaces_work()
needs_namespaces = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def _in_mount(root: Path, options: str, command: list[str]) -> list[str]:
    """``command`` run with a fresh tmpfs mounted at ``root`` with ``options`` (ro or rw)."""
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    namespace = ["unshare", "--user", "--map-root-user", "--mount"]
    return [*namespace, "sh", "-c", script, "sh", options, str(root), *command]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root, markers = tmp_path / "ckpt", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    return root, markers


@contextlib.contextmanager
def _started(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``command`` in its own process group; kill that group (by its pid) at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@needs_namespaces
@pytest.mark.parametrize("mode", ["caught", "local"], ids=["root", "local-tier"])
def test_construction_names_the_directory_and_the_reason(
    dirs: tuple[Path, Path], mode: str
) -> None:
    root, markers = dirs
    cmd = _in_mount(root, "ro", [sys.executable, str(WORKER), str(root), str(markers), mode])
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
    cmd = _in_mount(root, "ro", [sys.executable, str(WORKER), str(root), str(markers), "uncaught"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == CONFIG_ERROR_EXIT_CODE, done.stderr
    assert "CheckpointDirNotWritableError" in done.stderr  # the traceback is still printed
    assert str(root.resolve()) in done.stderr
    assert f"exiting with code {CONFIG_ERROR_EXIT_CODE}" in done.stderr


@needs_namespaces
def test_a_save_that_fails_later_names_the_directory(dirs: tuple[Path, Path]) -> None:
    root, markers = dirs
    cmd = _in_mount(root, "rw", [sys.executable, str(WORKER), str(root), str(markers), "remount"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["type"] == "SaveFailedError"
    assert str(root.resolve()) in report["message"] and "step 20" in report["message"]


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
    with _started(_in_mount(root, "ro", launcher), log) as proc:
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
        "resiliency.launcher.config_error",
        reason="the launcher's side needs resiliency-ft-launcher",
    )
    assert launcher_side.CONFIG_ERROR_EXIT_CODE == CONFIG_ERROR_EXIT_CODE == 78  # EX_CONFIG
