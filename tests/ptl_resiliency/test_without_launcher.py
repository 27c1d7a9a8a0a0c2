"""One process, no launcher: the FT callbacks say to use ft-launcher; the straggler one works."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning.pytorch as lp
import pytest
from lightning.pytorch.loggers import CSVLogger
from ptl_train_job import example

from resiliency.ptl import (
    FINISHED_FLAG_ENV,
    AutoResumeConfigError,
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    LauncherRequiredError,
    StragglerDetectionCallback,
)


def _trainer(tmp_path: Path, callbacks: list[Any], trainer_cls: Any = lp.Trainer, **kw: Any) -> Any:
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


def test_straggler_callback_single_process_reports_to_csv(tmp_path: Path) -> None:
    cb = StragglerDetectionCallback(
        report_time_interval=0.15,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_log=2,
        gpu_relative_perf_threshold=0.75,
        gpu_individual_perf_threshold=0.75,
        stop_if_detected=True,
        enable_ptl_logging=True,
    )
    logger = CSVLogger(tmp_path, name="logs", version=0)
    trainer = _trainer(tmp_path, [cb], max_steps=30, logger=logger, log_every_n_steps=1)
    trainer.fit(example.TinyModel(step_time=0.02))
    assert trainer.global_step == 30  # one rank is never a straggler against itself
    assert cb.stopped_at_step is None
    assert cb.last_report is not None
    rows = _read_csv(Path(logger.log_dir) / "metrics.csv")
    reported = [r for r in rows if r.get("straggler/training_step_relative_perf_min")]
    assert len(reported) >= 2, rows
    for row in reported:
        assert float(row["straggler/training_step_relative_perf_min"]) == pytest.approx(1.0)
        assert float(row["straggler/training_step_relative_perf_rank0"]) == pytest.approx(1.0)
        assert float(row["straggler/num_stragglers"]) == 0.0
        assert 0.0 < float(row["straggler/training_step_individual_perf_min"]) <= 1.0


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
    assert cb.last_report.section_relative_perf_scores["training_step"] == {0: pytest.approx(1.0)}
