"""Real read-only mounts for the checkpoint tests: a tmpfs in a private user and mount namespace
(``unshare --user --map-root-user --mount``), so no privilege is needed and the machine's mounts
are left alone; and the worker those tests run in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("readonly_root_worker.py")
REPO = Path(__file__).resolve().parents[2]


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
#: Skips a test where a private mount namespace cannot be made (with the reason).
needs_namespaces = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def in_mount(root: Path, options: str, command: list[str]) -> list[str]:
    """``command`` run with a fresh tmpfs mounted at ``root`` with ``options`` (ro or rw)."""
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    namespace = ["unshare", "--user", "--map-root-user", "--mount"]
    return [*namespace, "sh", "-c", script, "sh", options, str(root), *command]


def make_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """The checkpoint root (the mount point) and the worker's marker directory."""
    root, markers = tmp_path / "ckpt", tmp_path / "markers"
    root.mkdir()
    markers.mkdir()
    return root, markers


@contextlib.contextmanager
def running(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
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
