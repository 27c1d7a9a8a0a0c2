"""examples/checkpoint_ddp.py under torchrun, twice: the second run resumes from the first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpoint_ddp.py"


def _run(ckpt: Path, *extra: str) -> str:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    argv += ["--standalone", str(EXAMPLE), "--ckpt-dir", str(ckpt), *extra]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_second_run_resumes_from_the_first(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    first = _run(ckpt, "--steps", "20", "--save-every", "4", "--stop-at", "10")
    for rank in (0, 1):
        assert f"rank {rank}: resumed from step 0" in first, first
        assert f"rank {rank}: stopped at step 10" in first, first
    assert "latest checkpoint 8" in first
    second = _run(ckpt, "--steps", "20", "--save-every", "4")
    for rank in (0, 1):
        assert f"rank {rank}: resumed from step 8" in second, second
        assert f"rank {rank}: stopped at step 20" in second, second
        assert "samples 640" in second  # 20 steps x 32 samples, counted across the resume
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_000000016", "step_000000020"]
