"""The class-level ``Detector`` API: sections, wrapped callables, reports, runtime settings."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import CodeType
from typing import Any, ClassVar

from resiliency.straggler._aggregate import decode_all, fill_scores
from resiliency.straggler._exchange import make_exchange
from resiliency.straggler._gpu_backend import GpuBackend, select_gpu_backend
from resiliency.straggler._payload import RankSummary, encode_summary
from resiliency.straggler._schedule import ReportSchedule
from resiliency.straggler._settings import (
    NOT_SELECTED,
    DetectorState,
    check_profiling_interval,
    check_report_interval,
    check_scores,
)
from resiliency.straggler.errors import DetectorStateError, StragglerConfigError
from resiliency.straggler.report import Report, Thresholds
from resiliency.straggler.sections import (
    CpuSection,
    GpuSection,
    SectionSummary,
    SectionTimings,
    summarize,
)
from resiliency.straggler.wrapping import CallableId, CallableWrapper

__all__ = ["Detector"]

log = logging.getLogger(__name__)


class Detector:
    """Straggler detection through class methods; never instantiated.

    Typical use::

        Detector.initialize(scores_to_compute="all", report_time_interval=60.0)
        for batch in loader:
            with Detector.detection_section("step"):
                train_step(batch)
            report = Detector.generate_report_if_interval_elapsed()
            if report is not None and report.rank == 0:
                print(report.identify_stragglers())
        Detector.shutdown()

    With ``torch.distributed`` initialized, :meth:`generate_report` and
    :meth:`generate_report_if_interval_elapsed` are collective on the process group: every member
    must call them the same number of times. With ``gather_on_rank0=True`` (the default) only the
    group's rank 0 gets a report; the other ranks get ``None``, as in NVIDIA's resiliency
    extension.
    """

    initialized: ClassVar[bool] = False
    _state: ClassVar[DetectorState | None] = None
    # Hot-path lookups live on the class itself, one dict per profile_cuda value. When no GPU
    # back end exists, both names point to the same dict.
    _cpu_sections: ClassVar[dict[str, CpuSection]] = {}
    _gpu_sections: ClassVar[dict[str, CpuSection]] = {}
    _caller_names: ClassVar[dict[tuple[CodeType, int], str]] = {}

    def __init__(self) -> None:
        raise TypeError("Detector is used through its class methods; do not instantiate it")

    @classmethod
    def initialize(  # noqa: PLR0917 -- positional order of the established Detector API
        cls,
        scores_to_compute: str | Sequence[str] = "all",
        gather_on_rank0: bool = True,
        profiling_interval: int = 1,
        report_time_interval: float = 60.0,
        node_name: str | None = None,
        process_group: Any = None,
        *,
        samples_per_section: int = 1024,
        thresholds: Thresholds | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """Start straggler detection on this rank.

        Args:
            scores_to_compute: ``"all"`` or a list of ``"relative_perf_scores"`` and
                ``"individual_perf_scores"``.
            gather_on_rank0: Gather every rank's scores on the group's rank 0 (other ranks get
                empty score fields); if False, each rank's report holds only its own scores.
            profiling_interval: Time every N-th entry of each section (1 = every entry).
            report_time_interval: Seconds between reports of
                :meth:`generate_report_if_interval_elapsed`.
            node_name: This rank's node name in reports (default: the host name).
            process_group: ``torch.distributed`` group for all collectives (default group if
                None). Only members may call the Detector.
            samples_per_section: Durations kept per section between reports (memory bound).
            thresholds: Default thresholds of :meth:`Report.identify_stragglers`.
            clock: Monotonic clock in integer nanoseconds for section durations and for the
                report schedule (default: ``time.perf_counter_ns`` for sections and
                ``time.monotonic`` for the schedule). Tests and simulations pass a clock they
                advance themselves, so a section lasts exactly what they say.

        Raises:
            DetectorStateError: Already initialized (call :meth:`shutdown` first).
            StragglerConfigError: An argument is invalid.
        """
        if cls._state is not None:
            raise DetectorStateError(
                "Detector.initialize() was already called; call Detector.shutdown() first"
            )
        scores = check_scores(scores_to_compute)
        interval = check_profiling_interval(profiling_interval)
        report_interval = check_report_interval(report_time_interval)
        if isinstance(samples_per_section, bool) or not isinstance(samples_per_section, int):
            raise StragglerConfigError(
                f"samples_per_section must be an integer, got {samples_per_section!r}"
            )
        if samples_per_section < 1:
            raise StragglerConfigError(
                f"samples_per_section must be >= 1, got {samples_per_section}"
            )
        if node_name is not None and not isinstance(node_name, str):
            raise StragglerConfigError(f"node_name must be a string, got {node_name!r}")
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise StragglerConfigError(f"thresholds must be a Thresholds, got {thresholds!r}")
        if clock is not None and not callable(clock):
            raise StragglerConfigError(f"clock must be a callable returning ns, got {clock!r}")
        exchange = make_exchange(process_group)
        if clock is None:
            schedule = ReportSchedule(report_interval)
        else:
            schedule = ReportSchedule(report_interval, clock=lambda: clock() / 1e9)
        state = DetectorState(
            scores=scores,
            gather_on_rank0=bool(gather_on_rank0),
            profiling_interval=interval,
            samples_per_section=samples_per_section,
            node=node_name or socket.gethostname(),
            rank=exchange.rank if exchange is not None else 0,
            exchange=exchange,
            schedule=schedule,
            thresholds=thresholds or Thresholds(),
            wrapper=CallableWrapper(cls.detection_section),
        )
        if clock is not None:
            state.clock = clock
        cls._cpu_sections = {}
        cls._gpu_sections = {}
        cls._caller_names = {}
        cls._state = state
        cls.initialized = True
        log.info(
            "rank %d: straggler detection on (%s, %s, report every %.1f s, group of %d)",
            state.rank,
            ", ".join(sorted(scores)),
            "gathered on rank 0" if state.gather_on_rank0 else "per rank",
            report_interval,
            exchange.size if exchange is not None else 1,
        )

    @classmethod
    def _require(cls) -> DetectorState:
        state = cls._state
        if state is None:
            raise DetectorStateError(
                "the straggler Detector is not initialized; call Detector.initialize() first"
            )
        return state

    @classmethod
    def detection_section(cls, name: str | None = None, profile_cuda: bool = True) -> CpuSection:
        """The context manager that times one section.

        Args:
            name: Section name; ``None`` names it after the caller's ``file:line`` (the file
                relative to the working directory when inside it, so ranks agree).
            profile_cuda: Also time the section's GPU work (plug-in, else CUDA events, else
                CPU time only with one warning).

        Returns:
            A reusable context manager (the same object for the same name).

        Raises:
            DetectorStateError: The Detector is not initialized.
        """
        if name is None:
            frame = sys._getframe(1)
            name = cls._caller_names.get((frame.f_code, frame.f_lineno))
            if name is None:
                name = cls._name_caller(frame.f_code, frame.f_lineno)
        section = (cls._gpu_sections if profile_cuda else cls._cpu_sections).get(name)
        if section is None:
            return cls._new_section(name, profile_cuda)
        return section

    @classmethod
    def _name_caller(cls, code: CodeType, lineno: int) -> str:
        cls._require()
        path = code.co_filename
        try:
            relative = os.path.relpath(path)
        except ValueError:  # another drive on Windows
            relative = path
        if not relative.startswith(os.pardir):
            path = relative
        name = f"{path}:{lineno}"
        cls._caller_names[(code, lineno)] = name
        return name

    @classmethod
    def _new_section(cls, name: str, profile_cuda: bool) -> CpuSection:
        state = cls._require()
        if not isinstance(name, str) or not name:
            raise StragglerConfigError(f"a section name must be a non-empty string, got {name!r}")
        timings = state.timings.get(name)
        if timings is None:
            timings = SectionTimings(name, state.samples_per_section, state.profiling_interval)
            state.timings[name] = timings
        cpu = cls._cpu_sections.get(name)
        if cpu is None:
            cpu = cls._cpu_sections[name] = CpuSection(timings, state.clock)
        if not profile_cuda:
            return cpu
        if state.gpu is NOT_SELECTED:
            state.gpu = select_gpu_backend()
            if state.gpu is None:
                cls._gpu_sections = cls._cpu_sections
                return cpu
        gpu: GpuBackend | None = state.gpu
        if gpu is None:
            return cpu
        section = cls._gpu_sections[name] = GpuSection(timings, gpu, state.clock)
        return section

    @classmethod
    def wrap_callables(cls, callable_ids: Sequence[CallableId], profile_cuda: bool = True) -> None:
        """Time every call of the given callables in a section named ``str(callable_id)``.

        Args:
            callable_ids: The callables to wrap.
            profile_cuda: Also time the calls' GPU work (as :meth:`detection_section`).

        Raises:
            DetectorStateError: The Detector is not initialized.
            StragglerConfigError: A callable is missing, already wrapped, or has unknown
                ``ignored_args``; nothing is wrapped then.
        """
        cls._require().wrapper.wrap(list(callable_ids), profile_cuda=bool(profile_cuda))

    @classmethod
    def restore_original_callables(cls) -> None:
        """Undo every :meth:`wrap_callables` (a no-op when nothing is wrapped)."""
        if cls._state is not None:
            cls._state.wrapper.restore()

    @classmethod
    def set_profiling_interval(cls, profiling_interval: int) -> None:
        """Time every N-th entry of each section from now on, without re-initializing.

        Raises:
            StragglerConfigError: Not an integer >= 1.
            DetectorStateError: The Detector is not initialized.
        """
        state = cls._require()
        state.profiling_interval = check_profiling_interval(profiling_interval)
        for timings in state.timings.values():
            timings.interval = state.profiling_interval
            timings.tick = 0

    @classmethod
    def set_report_time_interval(cls, report_time_interval: float) -> None:
        """Change the seconds between reports; counts from the last report.

        With several ranks only the group root's value is used (it decides for all), so set it
        on every rank to keep them consistent after a root change.

        Raises:
            StragglerConfigError: Not a positive number.
            DetectorStateError: The Detector is not initialized.
        """
        cls._require().schedule.interval_s = check_report_interval(report_time_interval)

    @classmethod
    def set_thresholds(
        cls,
        gpu_rel_threshold: float | None = None,
        section_rel_threshold: float | None = None,
        gpu_indiv_threshold: float | None = None,
        section_indiv_threshold: float | None = None,
    ) -> Thresholds:
        """Change the default thresholds carried by the next reports; None keeps a value.

        Returns:
            The thresholds now in force.

        Raises:
            StragglerConfigError: A threshold is not in [0, 1].
            DetectorStateError: The Detector is not initialized.
        """
        state = cls._require()
        changes = {
            key: value
            for key, value in (
                ("gpu_rel_threshold", gpu_rel_threshold),
                ("section_rel_threshold", section_rel_threshold),
                ("gpu_indiv_threshold", gpu_indiv_threshold),
                ("section_indiv_threshold", section_indiv_threshold),
            )
            if value is not None
        }
        state.thresholds = replace(state.thresholds, **changes)
        return state.thresholds

    @classmethod
    def is_interval_elapsed(cls) -> bool:
        """Whether the last :meth:`generate_report_if_interval_elapsed` call found the report
        interval elapsed (and so generated a report), as in NVIDIA's resiliency extension.

        A local flag: no collective, and the same answer on every rank of the group. Use it on
        ranks that got ``None`` from that call (``gather_on_rank0=True``) to know that a report
        was produced on rank 0.

        Raises:
            DetectorStateError: The Detector is not initialized.
        """
        return cls._require().last_call_reported

    @classmethod
    def generate_report_if_interval_elapsed(cls) -> Report | None:
        """:meth:`generate_report` once ``report_time_interval`` has elapsed since the last report.

        Call it on every rank once per iteration. Collective when reports are: every rank
        reaches the same decision in the same call; cheap on most calls (see
        ``docs/straggler.md``).

        Returns:
            The report when the interval elapsed (``None`` on ranks other than 0 with
            ``gather_on_rank0=True``), else ``None``.

        Raises:
            DetectorStateError: The Detector is not initialized.
            ExchangeError: A collective failed.
        """
        state = cls._require()
        state.last_call_reported = state.schedule.elapsed(state.collective)
        if state.last_call_reported:
            return cls.generate_report()
        return None

    @classmethod
    def _local_window(
        cls, state: DetectorState
    ) -> tuple[dict[str, SectionSummary], dict[str, float]]:
        summaries: dict[str, SectionSummary] = {}
        medians: dict[str, float] = {}
        for name, timings in state.timings.items():
            summary = summarize(*timings.drain())
            if summary is not None:
                summaries[name] = summary
                medians[name] = summary.median_us
        return summaries, medians

    @classmethod
    def generate_report(cls) -> Report | None:
        """Score the window since the last report and start a new one.

        Collective on the process group when relative scores are computed or scores are
        gathered on rank 0.

        Returns:
            The report; ``None`` on every rank but the group's rank 0 when scores are gathered
            on rank 0 and the group has more than one rank (as in NVIDIA's resiliency
            extension). See :class:`Report` for the fields.

        Raises:
            DetectorStateError: The Detector is not initialized.
            ExchangeError: A collective failed.
        """
        state = cls._require()
        started = time.perf_counter()
        section_summaries, medians = cls._local_window(state)
        gpu: GpuBackend | None = None if state.gpu is NOT_SELECTED else state.gpu
        kernel_stats = gpu.read() if gpu is not None else {}
        if gpu is not None:
            dropped = gpu.dropped()
            if dropped > state.gpu_dropped:
                log.warning(
                    "rank %d: %s lost %d GPU timing records since the last report; GPU scores "
                    "cover the records kept",
                    state.rank,
                    gpu.description,
                    dropped - state.gpu_dropped,
                )
                state.gpu_dropped = dropped
        kernels = {k: (v.median_us, v.count) for k, v in kernel_stats.items() if v.count > 0}
        summary = RankSummary(rank=state.rank, node=state.node)
        if state.relative:
            summary.section_medians = medians
            summary.kernel_medians = kernels
        if state.individual:
            summary.section_individual = state.best.section_scores(medians)
            summary.gpu_individual = state.best.gpu_score(kernels)
        report = Report(
            local_section_summaries=section_summaries,
            local_kernel_summaries=kernel_stats,
            gather_on_rank0=state.gather_on_rank0,
            rank=state.rank,
            created_at=time.time(),
            thresholds=state.thresholds,
        )
        exchange = state.collective
        if exchange is None:
            fill_scores(
                report,
                decode_all([encode_summary(summary)], receiver_rank=state.rank),
                relative=state.relative,
                individual=state.individual,
            )
        else:
            payloads = exchange.gather(encode_summary(summary), to_all=not state.gather_on_rank0)
            if payloads is None:
                state.schedule.mark_reported()
                return None
            else:
                fill_scores(
                    report,
                    decode_all(payloads, receiver_rank=state.rank),
                    relative=state.relative,
                    individual=state.individual,
                    only_rank=None if state.gather_on_rank0 else state.rank,
                )
        state.schedule.mark_reported()
        report.generate_report_elapsed_time = (time.perf_counter() - started) * 1e3
        log.debug(
            "rank %d: report over %d sections and %d kernels took %.3f ms",
            state.rank,
            len(section_summaries),
            len(kernel_stats),
            report.generate_report_elapsed_time,
        )
        return report

    @classmethod
    def shutdown(cls) -> None:
        """Restore wrapped callables, release the GPU back end and forget all state.

        Safe to call when not initialized, and twice.
        """
        state = cls._state
        if state is None:
            return
        state.wrapper.restore()
        if state.gpu is not NOT_SELECTED and state.gpu is not None:
            state.gpu.shutdown()
        cls._state = None
        cls.initialized = False
        cls._cpu_sections = {}
        cls._gpu_sections = {}
        cls._caller_names = {}
