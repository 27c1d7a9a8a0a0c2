"""Replica transfers between two real gloo ranks: copies verify, a full disk and a short source
file fail only the copy concerned, with a message, and never the process (no SIGBUS)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ckpt_harness import can_mount_tmpfs

pytestmark = pytest.mark.timeout(180)

WORKER = Path(__file__).resolve().with_name("replicate_worker.py")
RANK_GROUP = Path(__file__).resolve().with_name("rank_group.py")


def _exchange(tmp: Path, scenario: str, tmpfs_mb: int | None = None) -> dict[int, Any]:
    root, out = tmp / "root", tmp / "out"
    root.mkdir()
    out.mkdir()
    argv = [sys.executable, str(RANK_GROUP), "2", str(out), "120", "0"]
    argv += [str(WORKER), str(root), scenario, str(out)]
    if tmpfs_mb is not None:
        script = f'mount -t tmpfs -o size={tmpfs_mb}m tmpfs "$0" && exec "$@"'
        argv = ["unshare", "--mount", "sh", "-c", script, str(root), *argv]
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        code = proc.wait(150)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    logs = "".join((out / f"rank{r}.log").read_text() for r in (0, 1))
    assert code == 0, f"the exchange failed ({code}):\n{logs[-4000:]}"
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}


def test_both_copies_arrive_verified_and_bit_identical(tmp_path: Path) -> None:
    results = _exchange(tmp_path, "ok")
    for r in (0, 1):
        assert results[r] == {"error": "", "verified": True, "same": True}


def test_a_full_disk_fails_that_copy_with_a_message_and_the_other_arrives(tmp_path: Path) -> None:
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs here (needs root or user namespaces)")
    results = _exchange(tmp_path, "full", tmpfs_mb=1)  # rank 1 receives 3 MiB into 1 MiB
    assert not results[1]["verified"]
    assert "writing the copy received from rank 0 failed" in results[1]["error"]
    assert "No space left on device" in results[1]["error"]
    assert results[0] == {"error": "", "verified": True, "same": True}


def test_a_source_file_shorter_than_its_manifest_sends_a_copy_that_fails(tmp_path: Path) -> None:
    results = _exchange(tmp_path, "short")
    assert not results[1]["verified"]
    assert "corrupt copy" in results[1]["error"]
    assert results[0] == {"error": "", "verified": True, "same": True}
