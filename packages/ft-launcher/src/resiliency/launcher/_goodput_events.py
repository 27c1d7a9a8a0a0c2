"""Goodput events of the launcher: the job, its cycles and hangs, written with no user code.

With ``--goodput-dir DIR`` (or ``RESILIENCY_GOODPUT_DIR`` in the environment) the launcher sets
``RESILIENCY_GOODPUT_DIR`` for itself and its workers, and records ``job_started`` /
``job_ended``, ``cycle_started`` / ``cycle_ended`` (with the cause), ``hang_detected`` (with
the detection latency and the timer's limit) and ``diagnosis`` (the failure's class, culprits,
decision and evidence) into this node's ledger file. Without a directory
every call is a no-op. Recording never raises into the launcher.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from resiliency.goodput import DIR_ENV, JOB_ID_ENV, Recorder

__all__ = ["GoodputEvents"]

logger = logging.getLogger(__name__)

# How the job ended (Outcome.reason) -> the cause of the cycle that was still open.
_END_CAUSES = {
    "succeeded": "success",
    "finished_on_healthy_nodes": "success",
    "signal_clean": "signal",
    "signal": "signal",
    "preempted": "preemption",
    "shutdown_workload": "workload_control",
    "node_excluded": "workload_control",
    "node_unhealthy": "workload_control",
}


class GoodputEvents:
    """The launcher's goodput recorder and the state of the cycle being recorded.

    Args:
        directory: the ledger directory; None disables recording.
        job: the job id (the rendezvous run id, as the workers' ``TORCHELASTIC_RUN_ID``).
    """

    def __init__(self, directory: str | None, job: str | None = None) -> None:
        job = os.environ.get(JOB_ID_ENV) or job
        self.recorder = Recorder(directory, job=job, rank=None)
        self.directory = directory  # the ledger the stop rules read the job's progress from
        self._cycles = 0
        self._open: int | None = None
        self._hang: tuple[str, list[int]] | None = None
        if directory is not None:
            os.environ[DIR_ENV] = os.path.abspath(directory)  # the workers inherit it

    @classmethod
    def from_args(cls, args: Any) -> GoodputEvents:
        """From ``--goodput-dir`` (default: ``RESILIENCY_GOODPUT_DIR``) and ``--rdzv-id``."""
        directory = getattr(args, "goodput_dir", None) or os.environ.get(DIR_ENV) or None
        return cls(directory, job=getattr(args, "rdzv_id", None))

    @property
    def enabled(self) -> bool:
        return self.recorder.enabled

    def _emit(self, event: str, **fields: Any) -> None:
        try:
            self.recorder.emit(event, **fields)
        except Exception:  # never into the launcher
            logger.warning("goodput: cannot record %s", event, exc_info=True)

    def job_started(self) -> None:
        self._emit("job_started")

    def cycle_started(self, node: str | None = None) -> None:
        """The workers were (re)started: a new cycle.

        Args:
            node: this node's name in the round (its group rank, as its workers write it); from
                now on the launcher's events carry it, so that two launchers on one host, or a
                replaced node, stay apart in the ledger.
        """
        if node is not None:
            self.recorder.rename(node)
        if self._open is not None:
            self.cycle_ended("crash")
        self._open = self._cycles
        self._cycles += 1
        self._hang = None
        self._emit("cycle_started", cycle=self._open)

    def hang_detected(self, rank: int | None, timer: str | None, elapsed: Any, limit: Any) -> None:
        """A monitor reported a hung rank: ``elapsed`` seconds since progress, ``limit`` allowed."""
        timeout = float(limit) if limit is not None else None
        latency = max(float(elapsed) - timeout, 0.0) if elapsed is not None and timeout else 0.0
        name = timer or "unknown"
        self._emit(
            "hang_detected",
            rank=int(rank if rank is not None else -1),
            timer=name,
            latency_s=latency,
            timeout_s=timeout,
        )
        if self._hang is None:
            self._hang = (name, [])
        if rank is not None:
            self._hang[1].append(int(rank))

    def cycle_ended(self, cause: str | None = None, ranks: list[int] | None = None) -> None:
        """The open cycle ended; ``cause`` defaults to hang (if one was seen) or crash."""
        if self._open is None:
            return
        timer = None
        if cause is None or cause == "hang":
            cause = "hang" if self._hang is not None else (cause or "crash")
        if cause == "hang" and self._hang is not None:
            timer, hung = self._hang
            ranks = ranks or hung
        self._emit("cycle_ended", cycle=self._open, cause=cause, timer=timer, ranks=ranks or [])
        self._open = None

    def diagnosis(
        self,
        *,
        cls: str,
        culprit_ranks: list[int],
        culprit_nodes: list[str],
        decision: str,
        evidence: dict[str, Any],
        rule: str,
    ) -> None:
        """The failure diagnosis of the cycle that just ended (after its ``cycle_ended``)."""
        self._emit(
            "diagnosis",
            cls=cls,
            culprit_ranks=culprit_ranks,
            culprit_nodes=culprit_nodes,
            decision=decision,
            evidence=evidence,
            rule=rule,
            cycle=self._cycles - 1,
        )
        # On disk at once, not at the next periodic flush: the launcher may leave right after
        # (stop, restart without this node), and the supervisor's sensor reads the verdict from
        # the ledger for the node's last status document. A failure is rare: one write is cheap.
        self.recorder.flush()

    def job_ended(self, exit_code: int, reason: str) -> None:
        """The launcher is exiting: close the open cycle, record the end, flush."""
        if self._open is not None:
            self.cycle_ended(_END_CAUSES.get(reason, "hang" if self._hang else "crash"))
        self._emit("job_ended", exit_code=int(exit_code), reason=reason)
        try:
            self.recorder.close()
        except Exception:
            logger.warning("goodput: cannot flush the ledger", exc_info=True)
