"""ft-launcher's stop mark: a SIGTERM while the launcher stops its workers is no preemption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resiliency.checkpoint import EXIT_INFO_DIR_ENV

# A rank with an EmergencyCheckpoint and nothing to save, that reports whether it saw a signal.
RANK = """
import sys, time
from resiliency.checkpoint import EmergencyCheckpoint
ec = EmergencyCheckpoint(lambda step, state: None, lead=2)
print("ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if ec.signal_received:
        print("flagged", flush=True)
        sys.exit(0)
    time.sleep(0.01)
sys.exit(3)
"""


def _rank(tmp_path: Path, mark: bytes | None) -> subprocess.Popen[str]:
    env = {**os.environ, EXIT_INFO_DIR_ENV: str(tmp_path)}
    if mark is not None:
        (tmp_path / "launcher_stopping").write_bytes(mark)
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("mark", [None, b"\0"])
def test_sigterm_without_the_mark_is_a_preemption(tmp_path: Path, mark: bytes | None) -> None:
    proc = _rank(tmp_path, mark)
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "flagged" in out


def test_sigterm_while_the_launcher_stops_the_workers_ends_the_rank_at_once(
    tmp_path: Path,
) -> None:
    proc = _rank(tmp_path, b"\0")
    with proc:  # closes the rank's stdout pipe (unread here) and reaps it
        try:
            # The launcher sets the byte after the worker mapped it: the mapping sees the write.
            fd = os.open(tmp_path / "launcher_stopping", os.O_WRONLY)
            os.pwrite(fd, b"\1", 0)
            os.close(fd)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 30
