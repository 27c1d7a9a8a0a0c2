"""One process, no launcher: the FT callbacks say to use ft-launcher; the straggler one works."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_flavour import CSVLogger, Trainer
from ptl_train_job import ManualClock, example

from resiliency.ptl import (
    FINISHED_FLAG_ENV,
    AutoResumeConfigError,
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    LauncherRequiredError,
    StragglerDetectionCallback,
)


def _trainer(tmp_path: Path, callbacks: list[Any], trainer_cls: Any = Trainer, **kw: Any) -> Any:
    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 5,
        "callbacks": callbacks,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": tmp_path,
    }
    return trainer_cls(**{**defaults, **kw})


@pytest.mark.parametrize("cls", [FaultToleranceCallback, FaultToleranceSectionsCallback])
def test_ft_callback_without_launcher_says_to_use_ft_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: type
) -> None:
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    trainer = _trainer(tmp_path, [cls(autoresume=False, calculate_timeouts=True)])
    with pytest.raises(LauncherRequiredError, match="ft-launcher") as info:
        trainer.fit(example.TinyModel())
    assert cls.__name__ in str(info.value)
    assert trainer.global_step == 0


def test_autoresume_without_flag_variable_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FINISHED_FLAG_ENV, raising=False)
    trainer = _trainer(
        tmp_path, [FaultToleranceCallback(autoresume=True, calculate_timeouts=False)]
    )
    with pytest.raises(AutoResumeConfigError, match=FINISHED_FLAG_ENV):
        trainer.fit(example.TinyModel())


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


class SlowingModel(example.TinyModel):
    """Each step advances the detector's clock by ``step_s``, ``factor`` times that from
    ``slow_from`` on: a step slowdown of a known size, with no sleep."""

    def __init__(self, clock: ManualClock, step_s: float, slow_from: int | None, factor: float):
        super().__init__()
        self.clock = clock
        self.step_s = step_s
        self.slow_from = slow_from
        self.factor = factor

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        slow = self.slow_from is not None and self.global_step >= self.slow_from
        self.clock.advance(self.step_s * (self.factor if slow else 1.0))
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)


@pytest.mark.parametrize("slow_from", [10, None], ids=["slows-down", "steady"])
def test_straggler_callback_single_process_flags_its_own_slowdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, slow_from: int | None
) -> None:
    # Steps of 20 ms, reports every 90 ms: after steps 5 and 10 (20 ms windows), then, once
    # the step takes 60 ms from step 10 on, after step 12: an individual score of 1/3.
    clock = ManualClock()
    cb = StragglerDetectionCallback(
        report_time_interval=0.09,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_log=2,
        gpu_relative_perf_threshold=0.75,
        gpu_individual_perf_threshold=0.75,
        stop_if_detected=True,
        enable_ptl_logging=True,
        logger_name="test.straggler",
        clock=clock,
    )
    logger = CSVLogger(tmp_path, name="logs", version=0)
    trainer = _trainer(tmp_path, [cb], max_steps=30, logger=logger, log_every_n_steps=1)
    with caplog.at_level(logging.WARNING, logger="test.straggler"):
        trainer.fit(SlowingModel(clock, step_s=0.02, slow_from=slow_from, factor=3.0))
    rows = _read_csv(Path(logger.log_dir) / "metrics.csv")
    reported = [r for r in rows if r.get("straggler/num_stragglers")]
    individual = [float(r["straggler/training_step_individual_perf_min"]) for r in reported]
    stragglers = [float(r["straggler/num_stragglers"]) for r in reported]
    warnings = [r.getMessage() for r in caplog.records if "straggler detected" in r.getMessage()]
    if slow_from is None:
        assert cb.stopped_at_step is None and trainer.global_step == 30
        assert individual == pytest.approx([1.0] * 6)  # a report every 5 steps
        assert stragglers == [0.0] * 6 and warnings == []
        return
    assert cb.stopped_at_step == 12 and trainer.global_step == 12
    assert [int(r["step"]) for r in reported] == [5, 10, 12]
    assert individual == pytest.approx([1.0, 1.0, 1 / 3])
    assert stragglers == [0.0, 0.0, 1.0]
    assert cb.last_report is not None
    assert cb.last_report.section_individual_perf_scores["training_step"] == {
        0: pytest.approx(1 / 3)
    }
    assert len(warnings) == 1
    assert "training_step individual score below 0.75 on rank 0" in warnings[0]
    assert warnings[0].endswith(": 0.33")


def test_straggler_callback_with_pytorch_lightning_trainer(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning")

    class PlModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inner = example.TinyModel(step_time=0.01)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.inner.training_step(batch, batch_idx)

        def configure_optimizers(self) -> Any:
            return self.inner.configure_optimizers()

        def train_dataloader(self) -> Any:
            return self.inner.train_dataloader()

    cb = StragglerDetectionCallback(
        report_time_interval=0.05,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=False,
        num_gpu_perf_scores_to_log=1,
        gpu_relative_perf_threshold=0.5,
        gpu_individual_perf_threshold=0.5,
        stop_if_detected=False,
        enable_ptl_logging=True,
    )
    trainer = _trainer(tmp_path, [cb], trainer_cls=pl.Trainer, max_steps=12)
    trainer.fit(PlModel())
    assert trainer.global_step == 12
    assert cb.last_report is not None
    # The section wrapped the model's training step under this Trainer too: it slept 10 ms.
    summary = cb.last_report.local_section_summaries["training_step"]
    assert summary.count >= 1 and summary.min_us >= 10_000
