"""Graceful preemption: workers that saved an emergency checkpoint exit 75, the launcher exits 5.

The contract with ``resiliency.checkpoint.EmergencyCheckpoint`` (both sides read the same
environment variables; neither imports the other):

* every worker gets ``RESILIENCY_PREEMPTED_EXIT_CODE=75``, ``RESILIENCY_EXIT_INFO_DIR`` (a private
  directory of this launcher) and ``RESILIENCY_TERM_TIMEOUT_S`` (``--term-timeout``: the time a
  worker has between the forwarded SIGTERM and SIGKILL);
* a rank that finished its emergency save writes ``rank_<RANK>.json`` =
  ``{"reason": "preempted", "step": N}`` there and exits 75;
* when the workers of this node exited that way (75, or 0, or stopped by the launcher itself),
  the launcher does not restart them and exits 5 (``PREEMPTED``), with
  "preempted, saved step N" in ``--exit-status-file``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from resiliency.ft import TerminationMark
from resiliency.launcher._contracts import (
    EXIT_INFO_DIR_ENV,
    PREEMPTED_EXIT_CODE_ENV,
    STOP_MARK_FILE,
    TERM_TIMEOUT_ENV,
)

__all__ = [
    "EXIT_INFO_DIR_ENV",
    "PREEMPTED_EXIT_CODE",
    "PREEMPTED_EXIT_CODE_ENV",
    "TERM_TIMEOUT_ENV",
    "Preemption",
]

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later", as a requeued job will

# Exit codes a worker stopped by the launcher itself can show next to the ones that saved.
_STOPPED_BY_LAUNCHER = {0, -int(signal.SIGTERM), -int(signal.SIGKILL)}


class Preemption:
    """This launcher's side of graceful preemption.

    Args:
        term_timeout: seconds between the forwarded SIGTERM and SIGKILL (``--term-timeout``).
    """

    def __init__(self, term_timeout: float) -> None:
        self.term_timeout = term_timeout
        self.directory = Path(tempfile.mkdtemp(prefix="ft-exit-"))  # mode 0700
        self.step: int | None = None
        self._mark = TerminationMark(self.directory / STOP_MARK_FILE)
        self._mark.create()

    def launcher_stopping(self, stopping: bool) -> None:
        """Set the stop mark the workers read in their SIGTERM handler (a byte in page cache)."""
        self._mark.set(stopping)

    def new_attempt(self) -> None:
        """Forget the exit infos of the workers of an earlier attempt (before new ones start).

        A rank of an attempt the launcher restarted (a hang, a failure) may have saved and left
        its exit info; read at the end of a later attempt whose workers all exit 0, it would
        turn a finished job into a preempted one.
        """
        for path in self.directory.glob("rank_*.json"):
            try:
                path.unlink()
            except OSError as exc:
                logger.warning("cannot remove the stale exit info %s: %s", path, exc)

    def worker_env(self) -> dict[str, str]:
        """The environment every worker gets."""
        return {
            PREEMPTED_EXIT_CODE_ENV: str(PREEMPTED_EXIT_CODE),
            EXIT_INFO_DIR_ENV: str(self.directory),
            TERM_TIMEOUT_ENV: f"{self.term_timeout:g}",
        }

    def verdict(self, codes: Mapping[int, int | None]) -> str | None:
        """Tell whether this node's workers ended by a graceful preemption.

        A worker that saved exits 75 and leaves ``rank_<RANK>.json`` in the exit-info directory;
        one the launcher stopped while it was already exiting (SIGTERM after its save, e.g. when
        the node hosting the stores left first) shows -15 but still left its file.

        Args:
            codes: local rank -> exit code (None while running) of the current workers.

        Returns:
            The detail line ("preempted, saved step N ...") when every worker has exited, with 75,
            0 or a signal from the launcher, and at least one exited 75 or reported a preempted
            save; else None.
        """
        done = [code for code in codes.values() if code is not None]
        if not done or len(done) != len(codes):
            return None
        if any(c not in _STOPPED_BY_LAUNCHER and c != PREEMPTED_EXIT_CODE for c in done):
            return None
        infos = [i for i in self._exit_infos().values() if i.get("reason") == "preempted"]
        if PREEMPTED_EXIT_CODE not in done and not infos:
            return None
        steps = sorted({i["step"] for i in infos if isinstance(i.get("step"), int)})
        saved = max(len(infos), sum(1 for code in done if code == PREEMPTED_EXIT_CODE))
        if len(steps) == 1:
            self.step = steps[0]
            return (
                f"preempted, saved step {steps[0]}: emergency checkpoint on {saved} of "
                f"{len(codes)} local worker(s)"
            )
        what = f"steps {steps}" if steps else "no exit info"
        logger.warning("workers exited as preempted but report %s in %s", what, self.directory)
        return f"preempted; {saved} of {len(codes)} local worker(s) saved ({what})"

    def _exit_infos(self) -> dict[str, dict[str, Any]]:
        infos: dict[str, dict[str, Any]] = {}
        for path in sorted(self.directory.glob("rank_*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                logger.warning("unreadable exit info %s: %s", path, exc)
                continue
            if isinstance(data, dict):
                infos[path.name] = data
        return infos

    def status_fields(self) -> dict[str, Any]:
        """Extra fields for ``--exit-status-file`` (the saved step, once known)."""
        return {"preempted_step": self.step} if self.step is not None else {}

    def close(self) -> None:
        """Remove the exit-info directory."""
        with contextlib.suppress(OSError):
            shutil.rmtree(self.directory)


#: Reads local rank -> exit code (None while running) of the current workers: the agent's
#: ``worker_returncodes``.
WorkerCodes = Callable[[], Mapping[int, int | None]]


def worker_codes(read: WorkerCodes) -> dict[int, int | None]:
    """Exit codes of the current workers (empty when none was started or none can be read)."""
    try:
        return dict(read())
    except Exception as exc:  # the process context may be half torn down
        logger.debug("cannot read the worker exit codes: %s", exc)
        return {}


def is_preempted(preemption: Preemption | None, read: WorkerCodes) -> str | None:
    """Return the preemption detail when the workers ended by a graceful preemption.

    Args:
        preemption: this launcher's side of graceful preemption (None: disabled).
        read: reads the current workers' exit codes.
    """
    if preemption is None:
        return None
    return preemption.verdict(worker_codes(read))


def clean_up(preemption: Preemption | None) -> None:
    """Remove the exit-info directory, if any."""
    if preemption is not None:
        preemption.close()


def new_attempt(preemption: Preemption | None) -> None:
    """Workers are about to start: the previous attempt's exit infos no longer apply."""
    if preemption is not None:
        preemption.new_attempt()


def launcher_stopping(preemption: Preemption | None, stopping: bool) -> None:
    """Tell the workers whether the next SIGTERM is the launcher's own stop (not a preemption)."""
    if preemption is not None:
        preemption.launcher_stopping(stopping)


def env_for(preemption: Preemption | None) -> dict[str, str]:
    """Worker environment for graceful preemption (empty when disabled)."""
    return preemption.worker_env() if preemption is not None else {}


def mark_stop_after_a_failure(preemption: Preemption | None, read: WorkerCodes) -> None:
    """A worker failed: the SIGTERM torch is about to send the others is the launcher's stop.

    torch's process context stops the surviving workers itself once it sees the failure.
    Without the stop mark a surviving rank took that SIGTERM for a preemption and started
    an emergency save its failed peer could never join, holding the restart up until it was
    killed. The wait before SIGKILL is ``--workers-stop-timeout`` (``bound_worker_close``).
    A worker that exited after a preemption (75, or SIGTERM from outside) is left to the
    preemption path.
    """
    codes = worker_codes(read)
    ended = [code for code in codes.values() if code is not None]
    if not any(code != 0 for code in ended) or len(ended) == len(codes):
        return
    if any(code in (PREEMPTED_EXIT_CODE, -signal.SIGTERM) for code in ended):
        return
    launcher_stopping(preemption, True)
