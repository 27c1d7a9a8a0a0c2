"""The steps between a failed call and the restart barrier, in NVRx's order: record whose
fault it was, abort, finalize, health-check."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from resiliency.inprocess._failed_call import is_collective_error
from resiliency.inprocess._monitor import Monitor
from resiliency.inprocess._restart_store import RestartStore
from resiliency.inprocess.exception import HealthCheckError, RankShouldRestart
from resiliency.inprocess.state import FrozenState, State

log = logging.getLogger(__name__)

Callback = Callable[[FrozenState], Any]


def record(exc: BaseException, *, state: State, store: RestartStore, monitor: Monitor) -> bool:
    """Log the failed call; when the fault is this rank's own, report it in the store.

    A restart the monitor asked for, and a collective that failed after a peer's reported
    fault (its echo), are not this rank's faults.

    Returns:
        Whether the fault is this rank's own.
    """
    it = state.iteration
    own = not (
        isinstance(exc, RankShouldRestart)
        or monitor.aborted.is_set()
        or (is_collective_error(exc) and store.fault_count(it) > 0)
    )
    if own:
        reason = f"{type(exc).__name__}: {exc}"
        log.error(
            "rank %d: iteration %d: the wrapped function raised %s",
            *(state.rank, it, reason),
            exc_info=exc,
        )
        store.report_fault(it, state.initial_rank, {"kind": "exception", "reason": reason})
    else:
        log.warning(
            "rank %d: iteration %d: restarting: %s (%s: %s)",
            *(state.rank, it, monitor.cause or "fault elsewhere", type(exc).__name__, exc),
        )
    return own


def abort(callback: Callback, state: State) -> None:
    """Run the ``abort`` callback; its failure is logged, the restart goes on."""
    try:
        callback(state.freeze())
    except Exception:
        log.exception("rank %d: the abort callback failed", state.rank)


def finalize_and_check(finalize: Callback | None, check: Callback | None, state: State) -> None:
    """Run ``finalize``, then the restart health check (the user's and the GPU's).

    Raises:
        HealthCheckError: a health check raised; this rank leaves the job.
    """
    if finalize is not None:
        finalize(state.freeze())
    if check is None:
        return
    try:
        check(state.freeze())
    except Exception as exc:
        raise HealthCheckError(
            f"rank {state.rank}: health check failed after iteration {state.iteration}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
