"""How a wrapped call ends on a rank: NVRx 0.5's ``completion`` and ``terminate`` callbacks, and
a respawned process that could not join telling its supervisor so."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from resiliency.inprocess import _rejoin
from resiliency.inprocess.state import State

log = logging.getLogger(__name__)


def completed(callback: Callable[..., Any] | None, state: State) -> None:
    """Run ``completion`` after the function completed on every active rank.

    Its failure is logged, not raised: the training itself is done and its value returns.
    """
    if callback is None:
        return
    try:
        callback(state.freeze())
    except Exception:
        log.exception(
            "rank %d: iteration %d: the completion callback failed (the wrapped call still "
            "returns its value)",
            state.rank,
            state.iteration,
        )


def terminated(callback: Callable[..., Any] | None, state: State, cause: BaseException) -> None:
    """Run ``terminate`` on a rank whose wrapped call ends with ``cause`` (and, for a respawned
    process that had not joined the job yet, record that it was refused).

    Raises:
        Exception: the callback's own failure, chained to ``cause`` (as in NVRx).
    """
    _rejoin.refuse(cause)
    if callback is None:
        return
    log.info(
        "rank %d: iteration %d: terminating (%s); running the terminate callback",
        state.rank,
        state.iteration,
        type(cause).__name__,
    )
    try:
        callback(state.freeze())
    except Exception as failure:
        log.error(
            "rank %d: the terminate callback failed: %s: %s",
            state.rank,
            type(failure).__name__,
            failure,
        )
        raise failure from cause
