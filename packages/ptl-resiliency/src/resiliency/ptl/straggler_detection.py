"""StragglerDetectionCallback: straggler scores for Lightning training steps."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resiliency.ptl._compat import CallbackBase, checkpoint_callback_types
from resiliency.straggler import Detector, Report

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import lightning.pytorch as pl

__all__ = ["STRAGGLER_SECTION", "StragglerDetectionCallback"]

STRAGGLER_SECTION = "training_step"
"""Name of the detection section wrapped around every ``training_step`` (the forward pass)."""

_METRIC_PREFIX = "straggler"


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


def _check_unit(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{name} must be in [0, 1] (a score below it flags a straggler), got {value}"
        )
    return float(value)


class StragglerDetectionCallback(CallbackBase):
    """Scores every rank's training step against the fastest rank and against its own past.

    Every ``training_step`` runs inside a detection section named ``"training_step"``: from
    ``on_train_batch_start`` to ``on_before_backward`` (or ``on_train_batch_end`` when there is no
    backward). It ends before the backward pass on purpose: with DDP the gradient all-reduce makes
    every rank wait for the slowest, so a section that includes it measures the same time on
    every rank and hides the straggler.

    Every ``report_time_interval`` seconds (the same iteration on every rank) a report is
    generated; rank 0 logs the best and worst scores and any stragglers, and, with
    ``enable_ptl_logging=True``, sends the scores to the Trainer's loggers as metrics: NVIDIA's
    keys ``gpu_relative_perf/{min,median,max}`` and ``gpu_individual_perf/{min,median,max}``, and
    this toolkit's ``straggler/<source>_<kind>_perf_...``. ``source`` is ``gpu`` when GPU kernel
    scores exist, else ``training_step`` (the section's wall time: the score on CPU-only
    machines, which NVIDIA's keys then carry too).

    The signature is NVIDIA's resiliency extension's (same names, same order).

    Args:
        report_time_interval: Seconds between reports, > 0.
        calc_relative_gpu_perf: Compute relative scores (against the fastest rank).
        calc_individual_gpu_perf: Compute individual scores (against the rank's own best past).
        num_gpu_perf_scores_to_print: How many best and how many worst ranks to log (and send as
            per-rank metrics), >= 0. Also accepted by keyword as ``num_gpu_perf_scores_to_log``.
        gpu_relative_perf_threshold: A relative score below this flags a straggler, in [0, 1].
        gpu_individual_perf_threshold: An individual score below this flags a straggler, in [0, 1].
        stop_if_detected: When a straggler is found, save a checkpoint (where a ``ModelCheckpoint``
            exists) and stop training on every rank at the same step.
        enable_ptl_logging: Send the scores to the Trainer's loggers as metrics.
        profiling_interval: Time every N-th training step (``Detector``'s profiling_interval).
        logger_name: Name of the :mod:`logging` logger the callback reports to (keyword only).
        num_gpu_perf_scores_to_log: The name some documentation uses for
            ``num_gpu_perf_scores_to_print`` (keyword only; not both).
        clock: Monotonic clock in integer nanoseconds that times the step and paces the reports,
            passed to ``Detector.initialize`` (keyword only; default: the system's). Tests and
            simulations give a clock they advance themselves.

    Raises:
        TypeError: A required argument is missing, given twice, or ``enable_ptl_logging`` is
            not a bool (e.g. a logger name passed by position, where an earlier release of this
            toolkit had ``logger_name``).
        ValueError: A value is out of range, or neither score kind is requested.
    """

    def __init__(  # noqa: PLR0917 (NVIDIA's signature)
        self,
        report_time_interval: float = _REQUIRED,
        calc_relative_gpu_perf: bool = _REQUIRED,
        calc_individual_gpu_perf: bool = _REQUIRED,
        num_gpu_perf_scores_to_print: int = _REQUIRED,
        gpu_relative_perf_threshold: float = _REQUIRED,
        gpu_individual_perf_threshold: float = _REQUIRED,
        stop_if_detected: bool = _REQUIRED,
        enable_ptl_logging: bool = _REQUIRED,
        profiling_interval: int = 1,
        *,
        logger_name: str = "nemo_logger.StragglerDetectionCallback",
        num_gpu_perf_scores_to_log: int = _REQUIRED,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        if num_gpu_perf_scores_to_log is not _REQUIRED:
            if num_gpu_perf_scores_to_print is not _REQUIRED:
                raise TypeError(
                    "give num_gpu_perf_scores_to_print or num_gpu_perf_scores_to_log (the same "
                    "thing), not both"
                )
            num_gpu_perf_scores_to_print = num_gpu_perf_scores_to_log
        required = {
            "report_time_interval": report_time_interval,
            "calc_relative_gpu_perf": calc_relative_gpu_perf,
            "calc_individual_gpu_perf": calc_individual_gpu_perf,
            "num_gpu_perf_scores_to_print": num_gpu_perf_scores_to_print,
            "gpu_relative_perf_threshold": gpu_relative_perf_threshold,
            "gpu_individual_perf_threshold": gpu_individual_perf_threshold,
            "stop_if_detected": stop_if_detected,
            "enable_ptl_logging": enable_ptl_logging,
        }
        missing = [name for name, value in required.items() if value is _REQUIRED]
        if missing:
            raise TypeError(
                f"StragglerDetectionCallback() missing required argument(s): {', '.join(missing)}"
            )
        if not isinstance(enable_ptl_logging, bool):
            raise TypeError(
                f"enable_ptl_logging must be a bool, got {enable_ptl_logging!r}; the 8th "
                "positional argument is enable_ptl_logging (NVIDIA's order), and logger_name is "
                "keyword only"
            )
        if (
            isinstance(profiling_interval, bool)
            or not isinstance(profiling_interval, int)
            or profiling_interval < 1
        ):
            raise ValueError(f"profiling_interval must be an int >= 1, got {profiling_interval!r}")
        if (
            isinstance(report_time_interval, bool)
            or not isinstance(report_time_interval, (int, float))
            or not math.isfinite(report_time_interval)
            or report_time_interval <= 0
        ):
            raise ValueError(
                "report_time_interval must be a positive number of seconds, "
                f"got {report_time_interval!r}"
            )
        if not (calc_relative_gpu_perf or calc_individual_gpu_perf):
            raise ValueError(
                "nothing to compute: set calc_relative_gpu_perf and/or calc_individual_gpu_perf"
            )
        if (
            isinstance(num_gpu_perf_scores_to_print, bool)
            or not isinstance(num_gpu_perf_scores_to_print, int)
            or num_gpu_perf_scores_to_print < 0
        ):
            raise ValueError(
                "num_gpu_perf_scores_to_print must be an int >= 0, "
                f"got {num_gpu_perf_scores_to_print!r}"
            )
        self.report_time_interval = float(report_time_interval)
        self.calc_relative_gpu_perf = bool(calc_relative_gpu_perf)
        self.calc_individual_gpu_perf = bool(calc_individual_gpu_perf)
        self.num_gpu_perf_scores_to_print = num_gpu_perf_scores_to_print
        self.enable_ptl_logging = enable_ptl_logging
        self.profiling_interval = profiling_interval
        self.gpu_relative_perf_threshold = _check_unit(
            "gpu_relative_perf_threshold", gpu_relative_perf_threshold
        )
        self.gpu_individual_perf_threshold = _check_unit(
            "gpu_individual_perf_threshold", gpu_individual_perf_threshold
        )
        self.stop_if_detected = bool(stop_if_detected)
        self._clock = clock
        self._log = logging.getLogger(logger_name)
        self._initialized = False
        self._profile_cuda = False
        self._section: AbstractContextManager[Any] | None = None
        self._rank = 0
        self.last_report: Report | None = None
        """The latest report on rank 0 (None on the other ranks, as NVIDIA's Detector gives)."""
        self.stopped_at_step: int | None = None
        """Global step at which training was stopped for a straggler, if it was."""

    @property
    def num_gpu_perf_scores_to_log(self) -> int:
        """The same as :attr:`num_gpu_perf_scores_to_print`."""
        return self.num_gpu_perf_scores_to_print

    # ---- Lightning hooks --------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Initialize the Detector (after the process group is up)."""
        if stage != "fit" or self._initialized:
            return
        self._rank = trainer.global_rank
        scores = []
        if self.calc_relative_gpu_perf:
            scores.append("relative_perf_scores")
        if self.calc_individual_gpu_perf:
            scores.append("individual_perf_scores")
        self._profile_cuda = trainer.strategy.root_device.type == "cuda"
        Detector.initialize(
            scores_to_compute=scores,
            gather_on_rank0=True,
            profiling_interval=self.profiling_interval,
            report_time_interval=self.report_time_interval,
            clock=self._clock,
        )
        self._initialized = True
        self.stopped_at_step = None
        self._log.info(
            "rank %d: straggler detection on (%s, report every %.1f s)",
            self._rank,
            ", ".join(scores),
            self.report_time_interval,
        )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Open the detection section."""
        if not self._initialized:
            return
        section = Detector.detection_section(STRAGGLER_SECTION, profile_cuda=self._profile_cuda)
        section.__enter__()
        self._section = section

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        """Close the section before the gradient all-reduce."""
        self._close_section()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close the section if open; report when the interval elapsed (same step on all ranks)."""
        self._close_section()
        if not self._initialized:
            return
        report = Detector.generate_report_if_interval_elapsed()
        if not Detector.is_interval_elapsed():  # no report in this call, on any rank
            return
        self.last_report = report
        stop = False
        if trainer.is_global_zero and report is not None:
            stop = self._handle_report(trainer, report)
        if self.stop_if_detected:
            # Rank 0 holds the gathered scores; every rank must stop at this same step.
            stop = bool(trainer.strategy.broadcast(stop, src=0))
            if stop:
                self._stop(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Shut the Detector down."""
        if stage == "fit":
            self._shutdown()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Close an open section and shut the Detector down."""
        self._shutdown()

    # ---- reporting --------------------------------------------------------------------------

    def _scores(self, report: Report) -> tuple[str, dict[str, dict[int, float]]]:
        """Pick GPU scores when there are any, else the step section's scores."""
        relative = report.gpu_relative_perf_scores
        individual = report.gpu_individual_perf_scores
        source = "gpu"
        if not relative and not individual:
            source = STRAGGLER_SECTION
            relative = report.section_relative_perf_scores.get(STRAGGLER_SECTION, {})
            individual = report.section_individual_perf_scores.get(STRAGGLER_SECTION, {})
        chosen: dict[str, dict[int, float]] = {}
        if self.calc_relative_gpu_perf:
            chosen["relative"] = relative
        if self.calc_individual_gpu_perf:
            chosen["individual"] = individual
        return source, chosen

    def _handle_report(self, trainer: pl.Trainer, report: Report) -> bool:
        """Log scores and stragglers on rank 0; return whether a straggler was found."""
        source, by_kind = self._scores(report)
        thresholds = {
            "relative": self.gpu_relative_perf_threshold,
            "individual": self.gpu_individual_perf_threshold,
        }
        metrics: dict[str, float] = {}
        stragglers: dict[str, list[int]] = {}
        k = self.num_gpu_perf_scores_to_print
        for kind, scores in by_kind.items():
            if not scores:
                self._log.info("straggler report: no %s %s scores yet", source, kind)
                continue
            ranked = sorted(scores.items(), key=lambda item: item[1])
            worst, best = ranked[:k], ranked[::-1][:k]
            name = f"{_METRIC_PREFIX}/{source}_{kind}_perf"
            metrics[f"{name}_min"] = ranked[0][1]
            metrics[f"{name}_max"] = ranked[-1][1]
            metrics[f"{name}_median"] = statistics.median(scores.values())
            for rank, score in {**dict(worst), **dict(best)}.items():
                metrics[f"{name}_rank{rank}"] = score
            if k:
                self._log.info(
                    "straggler report: %s %s scores, best %s, worst %s",
                    source,
                    kind,
                    self._format(best, report),
                    self._format(worst, report),
                )
            values = list(scores.values())
            metrics[f"gpu_{kind}_perf/min"] = min(values)  # NVIDIA's keys
            metrics[f"gpu_{kind}_perf/median"] = statistics.median(values)
            metrics[f"gpu_{kind}_perf/max"] = max(values)
            flagged = [rank for rank, score in ranked if score < thresholds[kind]]
            if flagged:
                stragglers[kind] = flagged
        for kind, ranks in stragglers.items():
            self._log.warning(
                "straggler detected: %s %s score below %.2f on %s",
                source,
                kind,
                thresholds[kind],
                self._format([(r, by_kind[kind][r]) for r in ranks], report),
            )
        metrics[f"{_METRIC_PREFIX}/num_stragglers"] = float(
            len({r for ranks in stragglers.values() for r in ranks})
        )
        for kind in by_kind:  # NVIDIA logs NaN when there are no scores yet
            for stat in ("min", "median", "max"):
                metrics.setdefault(f"gpu_{kind}_perf/{stat}", math.nan)
        if self.enable_ptl_logging:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        return bool(stragglers)

    @staticmethod
    def _format(items: list[tuple[int, float]], report: Report) -> str:
        parts = []
        for rank, score in items:
            node = report.rank_to_node.get(rank)
            where = f"rank {rank}" + (f" ({node})" if node else "")
            parts.append(f"{where}: {score:.2f}")
        return ", ".join(parts) if parts else "none"

    def _stop(self, trainer: pl.Trainer) -> None:
        types = checkpoint_callback_types()
        ckpt = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, types)), None)
        if ckpt is not None and ckpt.dirpath is not None:
            if ckpt.save_last:
                name = f"{ckpt.CHECKPOINT_NAME_LAST}{ckpt.FILE_EXTENSION}"
            else:
                name = f"straggler-stop-step={trainer.global_step}{ckpt.FILE_EXTENSION}"
            path = Path(ckpt.dirpath) / name
            trainer.save_checkpoint(path)
            self._log.warning(
                "rank %d: stopping training at step %d for a straggler; checkpoint saved to %s",
                self._rank,
                trainer.global_step,
                path,
            )
        else:
            self._log.warning(
                "rank %d: stopping training at step %d for a straggler (no ModelCheckpoint: "
                "no checkpoint saved)",
                self._rank,
                trainer.global_step,
            )
        self.stopped_at_step = trainer.global_step
        trainer.should_stop = True

    def _close_section(self) -> None:
        section, self._section = self._section, None
        if section is not None:
            section.__exit__(None, None, None)

    def _shutdown(self) -> None:
        self._close_section()
        if self._initialized:
            self._initialized = False
            Detector.shutdown()
