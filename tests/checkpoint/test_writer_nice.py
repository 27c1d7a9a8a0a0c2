"""The writer's priority: ``RESILIENCY_CKPT_WRITER_NICE``, and a typo in it, which must not
cost a save."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from resiliency.checkpoint import CheckpointManager

pytestmark = pytest.mark.timeout(180)


def _nice_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of stat(5), counted after the command name


@pytest.mark.parametrize(("value", "expected"), [("3", 3), ("three", 10)])
def test_the_writer_runs_at_the_nice_value_asked_or_the_default_on_a_typo(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    value: str,
    expected: int,
) -> None:
    monkeypatch.setenv("RESILIENCY_CKPT_WRITER_NICE", value)
    own = os.nice(0)
    with CheckpointManager(tmp_path / "ckpt") as manager:
        writer = manager._writer
        writer.wait_ready(writer.deadline(120))  # its imports are done: it set its priority
        manager.save(1, {"x": torch.ones(8)}).wait()
        pid = manager.writer_pid
        assert pid is not None
        assert _nice_of(pid) == min(own + expected, 19)
        target = {"x": torch.zeros(8)}
        assert manager.load(target) == 1 and bool((target["x"] == 1).all())
    err = capfd.readouterr().err
    if value == "three":
        assert "RESILIENCY_CKPT_WRITER_NICE='three' is not an integer" in err
