"""every_n_train_steps="auto" (DistributedCheckpointCallback) and local/persistent_ckpt_interval=
"auto" (LocalCheckpointCallback): the interval the job's own goodput ledger advises
(``resiliency-goodput advise``) for each tier, within the user's bounds, in one process."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from lightning_flavour import Trainer
from ptl_ckpt_job import Model

from resiliency.goodput import AutoInterval, advise, get_recorder, read_ledger
from resiliency.ptl import (
    CheckpointCallbackConfigError,
    DistributedCheckpointCallback,
    LocalCheckpointCallback,
)

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


def _failing_job_ledger(path: Path, failures: int = 4, local_every: int | None = None) -> None:
    """Cycles of 600 s at 1 s a step, a 5 s blocking save every 100 steps, then a crash.

    With ``local_every``, also a 0.2 s local save every that many steps; restarts restore from
    the local tier (2 s) then.
    """
    lines, now, step = [], 0.0, 0
    for attempt in range(failures + 1):
        lines.append(_line(now, "cycle_started", attempt, cycle=attempt))
        if attempt:
            now += 10.0 if local_every is None else 2.0
            saved = step - step % (local_every or 100)
            tier = "persistent" if local_every is None else "local"
            duration = 10.0 if local_every is None else 2.0
            lines.append(
                _line(
                    now,
                    "checkpoint_loaded",
                    attempt,
                    step=saved,
                    tier=tier,
                    bytes=1,
                    duration_s=duration,
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
            if local_every is not None and step % local_every == 0:
                save = {"tier": "local", "bytes": 1, "blocked_s": 0.2, "total_s": 0.2}
                now += 0.2
                lines.append(_line(now, "checkpoint_saved", attempt, step=step, **save))
        cause = "crash" if attempt < failures else "success"
        lines.append(_line(end, "cycle_ended", attempt, cycle=attempt, cause=cause, ranks=[]))
        now = end + 20.0
    path.write_text("\n".join(lines) + "\n")


def _train(callback: Any) -> None:
    """30 steps of a one-process Trainer with ``callback``."""
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


def _fit(work: Path, every: Any) -> tuple[DistributedCheckpointCallback, list[int]]:
    callback = DistributedCheckpointCallback(
        work / "ckpt", every_n_train_steps=every, keep_last=None, async_save=False
    )
    _train(callback)
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


def _fit_tiers(work: Path, local: Any, persistent: Any) -> tuple[LocalCheckpointCallback, dict]:
    callback = LocalCheckpointCallback(
        work / "local",
        local_ckpt_interval=local,
        persistent_ckpt_dir=work / "persistent",
        persistent_ckpt_interval=persistent,
        replicas=0,  # one process: no peer node to hold a copy
        keep_last=None,
        local_keep_last=100,
        async_save=False,
    )
    _train(callback)
    saved = {
        tier: sorted(int(p.name[5:]) for p in (work / tier).glob("step_*"))
        for tier in ("local", "persistent")
    }
    return callback, saved


def test_local_callback_takes_each_tiers_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "goodput"
    ledger.mkdir()
    _failing_job_ledger(ledger / "train.node0.jsonl", local_every=10)
    monkeypatch.setenv("RESILIENCY_GOODPUT_DIR", str(ledger))
    monkeypatch.setenv("RESILIENCY_JOB_ID", "train")
    advice = {t.tier: t for t in advise(read_ledger([ledger])).tiers}
    local_advised = advice["local"].steps(advice["local"].advised_interval_s)
    assert local_advised is not None and 6 <= local_advised <= 30  # Daly: ~16 s at 1 s a step
    # The persistent bounds cap its advice, so it lands in this 30-step run.
    callback, saved = _fit_tiers(tmp_path / "a", "auto", AutoInterval(5, 12, 7))
    assert callback.intervals == {"local": local_advised, "persistent": 12}
    # Each tier at its own interval; the last step on both at the end of training.
    assert saved["local"] == sorted({s for s in range(1, 31) if s % local_advised == 0} | {30})
    assert saved["persistent"] == [12, 24, 30]


def test_local_callback_auto_without_a_ledger_keeps_each_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESILIENCY_GOODPUT_DIR", str(tmp_path / "empty"))
    callback, saved = _fit_tiers(tmp_path / "b", "auto", AutoInterval(5, 20, 8))
    assert callback.intervals == {"local": 10, "persistent": 8}
    assert saved == {"local": [10, 20, 30], "persistent": [8, 16, 24, 30]}


@pytest.mark.parametrize("bad", [0, -3, "often", 2.5, True])
def test_local_callback_rejects_a_bad_interval(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(CheckpointCallbackConfigError, match="local_ckpt_interval"):
        LocalCheckpointCallback(tmp_path, local_ckpt_interval=bad)
