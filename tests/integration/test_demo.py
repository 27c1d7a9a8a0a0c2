"""The README's demo (`nox -s demo`) runs and tells the story it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("resiliency.launcher")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_launcher_demo_detects_the_hang_names_the_culprit_and_finishes():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo_launcher.py"), "--timeout", "150"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "[timer: heartbeat]" in out
    assert "likely culprit: rank 1" in out
    assert "finished      : yes" in out
    assert "demo OK" in out


def test_monitor_demo_dumps_the_stack_and_kills_the_rank():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo_hang.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "all_reduce_gradients" in out  # the hung function, from the stack dump
    assert "killed by SIGTERM" in out
