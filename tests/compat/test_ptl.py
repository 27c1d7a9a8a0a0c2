"""The Lightning callbacks as a user of NVIDIA's resiliency extension (NVRx) 0.4.1 writes them,
after changing only the import (``nvidia_resiliency_ext.ptl_resiliency`` -> ``resiliency.ptl``).

Written from NVRx's documented callback signatures (``StragglerDetectionCallback``,
``FaultToleranceCallback``, ``FaultToleranceSectionsCallback``), their state file names and the
metric keys the straggler callback logs.

Needs ptl-resiliency (Lightning, torch, ft-core, straggler): runs in the ``ptl`` nox session.
"""

from __future__ import annotations

import csv
import inspect
import json
import shutil
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as lp
import torch
from lightning.pytorch.loggers import CSVLogger

from resiliency.ft import (
    FaultToleranceConfig,
    MonitorProcess,
    WorkloadAction,
    WorkloadControlRequest,
    create_socket_dir,
)
from resiliency.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    StragglerDetectionCallback,
)

NVRX_STRAGGLER_PARAMS = [
    "report_time_interval",
    "calc_relative_gpu_perf",
    "calc_individual_gpu_perf",
    "num_gpu_perf_scores_to_print",
    "gpu_relative_perf_threshold",
    "gpu_individual_perf_threshold",
    "stop_if_detected",
    "enable_ptl_logging",
    "profiling_interval",
    "logger_name",
]


def test_straggler_callback_parameter_names_and_order():
    names = list(inspect.signature(StragglerDetectionCallback).parameters)
    assert names[: len(NVRX_STRAGGLER_PARAMS)] == NVRX_STRAGGLER_PARAMS
    params = inspect.signature(StragglerDetectionCallback).parameters
    assert params["profiling_interval"].default == 1
    assert params["logger_name"].default == "nemo_logger.StragglerDetectionCallback"


def test_straggler_callback_positional_as_in_nvrx():
    cb = StragglerDetectionCallback(5.0, True, False, 3, 0.7, 0.7, False, True, 2)
    assert cb.report_time_interval == 5.0
    assert cb.num_gpu_perf_scores_to_print == 3
    assert cb.enable_ptl_logging is True
    assert cb.profiling_interval == 2


def test_straggler_callback_accepts_the_documented_log_spelling():
    cb = StragglerDetectionCallback(
        report_time_interval=5.0,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_log=4,
        gpu_relative_perf_threshold=0.7,
        gpu_individual_perf_threshold=0.7,
        stop_if_detected=False,
        enable_ptl_logging=False,
    )
    assert cb.num_gpu_perf_scores_to_print == 4


def test_positional_argument_landing_in_logger_name_is_an_error():
    with pytest.raises(TypeError):
        StragglerDetectionCallback(5.0, True, True, 3, 0.7, 0.7, False, True, 1, "my.logger")
    # An earlier order had logger_name in 8th place: a string there is not enable_ptl_logging.
    with pytest.raises(TypeError, match="enable_ptl_logging"):
        StragglerDetectionCallback(5.0, True, True, 3, 0.7, 0.7, False, "my.logger")


def test_straggler_callback_needs_a_score_kind():
    with pytest.raises(ValueError):
        StragglerDetectionCallback(5.0, False, False, 3, 0.7, 0.7, False, True)


class _Tiny(lp.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        # Steps must outlast the 0.05 s report interval, or an idle machine finishes all 20 steps
        # before the first report and nothing is logged.
        time.sleep(0.02)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=2)


@pytest.mark.slow
def test_straggler_callback_logs_nvrx_metric_keys(tmp_path: Path):
    cb = StragglerDetectionCallback(
        report_time_interval=0.05,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_print=1,
        gpu_relative_perf_threshold=0.7,
        gpu_individual_perf_threshold=0.7,
        stop_if_detected=False,
        enable_ptl_logging=True,
    )
    logger = CSVLogger(tmp_path, name="logs", version=0)
    trainer = lp.Trainer(
        accelerator="cpu",
        max_steps=20,
        callbacks=[cb],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Tiny())
    with open(Path(logger.log_dir) / "metrics.csv") as handle:
        header = next(csv.reader(handle))
    for key in (
        "gpu_relative_perf/min",
        "gpu_relative_perf/median",
        "gpu_relative_perf/max",
        "gpu_individual_perf/min",
        "gpu_individual_perf/median",
        "gpu_individual_perf/max",
    ):
        assert key in header, header


def test_sections_callback_signature_and_exc_handling_policy():
    names = list(inspect.signature(FaultToleranceSectionsCallback).parameters)
    assert names[:6] == [
        "autoresume",
        "calculate_timeouts",
        "simulated_fault_params",
        "exp_dir",
        "logger_name",
        "exc_handling_policy",
    ]

    def policy(exc):
        return WorkloadControlRequest(WorkloadAction.ShutdownWorkload, str(exc))

    positional = FaultToleranceSectionsCallback(False, False, None, None, "log", policy)
    keyword = FaultToleranceSectionsCallback(
        autoresume=False, calculate_timeouts=False, exc_handling_policy=policy
    )
    assert positional.exc_handling_policy is policy and keyword.exc_handling_policy is policy


def test_heartbeat_callback_signature():
    names = list(inspect.signature(FaultToleranceCallback).parameters)
    assert names[:5] == [
        "autoresume",
        "calculate_timeouts",
        "simulated_fault_params",
        "exp_dir",
        "logger_name",
    ]


def test_state_file_names():
    assert FaultToleranceCallback.TIMEOUTS_FILENAME == "_ft_state.json"
    assert FaultToleranceSectionsCallback.TIMEOUTS_FILENAME == "_ft_state_.json"
    assert FaultToleranceCallback.FT_DIR_NAME == FaultToleranceSectionsCallback.FT_DIR_NAME
    assert FaultToleranceCallback.FT_DIR_NAME == "ft_state"


_SAVED_STATE = {
    "current_timeouts": {
        "heartbeat": {"initial": 612.5, "subsequent": 95.0, "were_calculated": True},
        "section": {
            "section": {"setup": 400.0, "step": 12.0, "checkpointing": 240.0},
            "out_of_section": 30.0,
            "calculated_sections": ["setup", "step", "checkpointing"],
            "is_out_of_section_calculated": True,
        },
    }
}


@pytest.fixture
def monitor(tmp_path, monkeypatch):
    directory = create_socket_dir("compat-ptl-")
    cfg = FaultToleranceConfig(
        rank_section_timeouts={"setup": 600.0, "step": 600.0, "checkpointing": 600.0}
    )
    with open(tmp_path / "monitor.log", "wb") as log:
        proc = MonitorProcess.start(cfg, directory / "rank-0.sock", 0, stderr=log, start_timeout=60)
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", str(proc.socket_path))
    monkeypatch.setenv("RANK", "0")
    yield proc
    proc.stop(timeout=5.0)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("callback_cls", "file_name"),
    [
        (FaultToleranceCallback, "_ft_state.json"),
        (FaultToleranceSectionsCallback, "_ft_state_.json"),
    ],
)
def test_callbacks_read_nvrx_state_files(monitor, tmp_path, callback_cls, file_name):
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    (exp_dir / file_name).write_text(json.dumps(_SAVED_STATE))
    cb = callback_cls(autoresume=False, calculate_timeouts=True, exp_dir=exp_dir)
    trainer = types.SimpleNamespace(global_rank=0)
    cb.setup(trainer, None, "fit")
    try:
        assert cb.client is not None
        if callback_cls is FaultToleranceCallback:
            assert cb.client.hb_timeouts.subsequent == 95.0
        else:
            sections = dict(cb.client.section_timeouts.section)
            assert sections["setup"] == 400.0  # as saved
            # NVRx has no floor; here the saved 12 s is raised to calculated_timeout_floor.
            assert sections["step"] == 60.0
    finally:
        cb.teardown(trainer, None, "fit")
