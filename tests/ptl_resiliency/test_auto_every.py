"""DistributedCheckpointCallback(every_n_train_steps="auto"): the interval the job's own goodput
ledger advises (``resiliency-goodput advise``), within the user's bounds, in one process."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from lightning_flavour import Trainer
from ptl_ckpt_job import Model

from resiliency.goodput import AutoInterval, get_recorder
from resiliency.ptl import DistributedCheckpointCallback

pytestmark = pytest.mark.timeout(180)
T0 = datetime(2026, 11, 23, tzinfo=timezone.utc)


def _line(seconds: float, event: str, attempt: int, **fields: Any) -> str:
    return json.dumps(
        {
            "schema": 1,
            "job": "train",
            "event": event,
            "time": (T0 + timedelta(seconds=seconds)).isoformat(),
            "mono": seconds,
            "node": "0",
            "rank": 0,
            "attempt": attempt,
            **fields,
        }
    )


def _failing_job_ledger(path: Path, failures: int = 4) -> None:
    """Cycles of 600 s at 1 s a step, a 5 s blocking save every 100 steps, then a crash."""
    lines, now, step = [], 0.0, 0
    for attempt in range(failures + 1):
        lines.append(_line(now, "cycle_started", attempt, cycle=attempt))
        if attempt:
            now += 10.0
            saved = step - step % 100
            lines.append(
                _line(
                    now,
                    "checkpoint_loaded",
                    attempt,
                    step=saved,
                    tier="persistent",
                    bytes=1,
                    duration_s=10.0,
                )
            )
            step = saved
        end = now + 600.0
        while now + 1.0 < end:
            now += 1.0
            step += 1
            lines.append(_line(now, "step", attempt, step=step))
            if step % 100 == 0:
                save = {"tier": "persistent", "bytes": 1, "blocked_s": 5.0, "total_s": 5.0}
                now += 5.0
                lines.append(_line(now, "checkpoint_saved", attempt, step=step, **save))
        cause = "crash" if attempt < failures else "success"
        lines.append(_line(end, "cycle_ended", attempt, cycle=attempt, cause=cause, ranks=[]))
        now = end + 20.0
    path.write_text("\n".join(lines) + "\n")


def _fit(work: Path, every: Any) -> tuple[DistributedCheckpointCallback, list[int]]:
    callback = DistributedCheckpointCallback(
        work / "ckpt", every_n_train_steps=every, keep_last=None, async_save=False
    )
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=30,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    try:
        trainer.fit(Model(0.0))
    finally:
        get_recorder().close()  # the ledger's writer thread (RESILIENCY_GOODPUT_DIR is set)
    steps = sorted(int(p.parent.name[5:]) for p in (work / "ckpt").glob("step_*/manifest.json"))
    return callback, steps


def test_auto_takes_the_advised_interval_within_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "goodput"
    ledger.mkdir()
    _failing_job_ledger(ledger / "train.node0.jsonl")
    monkeypatch.setenv("RESILIENCY_GOODPUT_DIR", str(ledger))
    monkeypatch.setenv("RESILIENCY_JOB_ID", "train")
    bounds = AutoInterval(min_steps=5, max_steps=12, default_steps=7)
    advised, why = bounds.steps()
    assert advised == 12 and "clamped to 12" in why  # Daly gives ~78 steps here
    callback, saved = _fit(tmp_path / "a", bounds)
    assert callback.every_n_train_steps == 12
    assert saved == [12, 24, 30]  # and the last step at the end of training


def test_auto_keeps_the_default_without_a_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESILIENCY_GOODPUT_DIR", str(tmp_path / "empty"))
    callback, saved = _fit(tmp_path / "b", AutoInterval(min_steps=5, max_steps=12, default_steps=7))
    assert callback.every_n_train_steps == 7
    assert saved == [7, 14, 21, 28, 30]
    assert (
        DistributedCheckpointCallback(tmp_path, every_n_train_steps="auto")._auto == AutoInterval()
    )
