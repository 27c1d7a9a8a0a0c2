"""What is left of a failed call: whether its error echoes a peer's fault, and its objects."""

from __future__ import annotations

import gc
import time
import traceback

import torch.distributed as dist

# Seconds the main thread sleeps (GIL released) before freeing a failed call's objects.
_DRAIN_S = 0.05


def is_collective_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer's connection went away."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("gloo" in text or "Connection closed" in text)


class Fence:
    """Keeps the objects that existed before a call out of the collector's scans.

    A full ``gc.collect()`` walks every tracked object of the process: with torch imported,
    0.6 s per pass here (two passes: 1.1 s of a 1.25 s restart). ``close()`` before the call
    freezes what exists then (``gc.freeze``), so freeing a failed call scans only what the
    call created; ``open()`` afterwards hands the frozen objects back to the collector.
    Someone else's freeze (a fork server's, the user's) is theirs to undo: then ``open()``
    leaves the frozen objects frozen.
    """

    def __init__(self) -> None:
        self._thaw = gc.get_freeze_count() == 0

    def close(self) -> None:
        """Freeze every object that exists now (just before the wrapped function is called)."""
        gc.freeze()

    def open(self) -> None:
        """Give the frozen objects back to the collector, unless someone else froze first."""
        if self._thaw:
            gc.unfreeze()


def release(exc: BaseException, fence: Fence, aborted_at: float) -> None:
    """Free what the failed call's frames hold (its DDP model, its process group).

    Not earlier than the restart barrier, and not within ``_DRAIN_S`` of the abort
    (``aborted_at``, monotonic), so that gloo's worker threads finish the aborted work first.
    The group's destructor itself waits for them with the GIL released (torch's pybind holder
    for ``ProcessGroup``), so this is not about a deadlock on the GIL. But with the wait
    removed, a clean-clone run of test_a_gil_released_hang_is_aborted_and_every_rank_restarts
    hung in the next ``init_process_group`` on every rank, three attempts in a row (29 Nov);
    the wait is kept until that is understood. A barrier that took that long (waiting for a
    respawned rank) has already given the threads the time; one that all ranks passed at once
    is topped up with a short sleep. The collection runs while ``fence`` is closed: it scans
    the call's objects only.
    """
    time.sleep(max(0.0, aborted_at + _DRAIN_S - time.monotonic()))
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None  # the frames' own references to each other
    try:
        while gc.collect():
            pass
    finally:
        fence.open()


class PendingRelease:
    """A failed call's :func:`release`, run as early as it may: while the restart barrier
    waits (for a respawned rank, say) once the drain after the abort is over, else right
    after the barrier. Either way it runs once.

    Args:
        exc: the failed call's exception.
        fence: the fence closed before the call.
        aborted_at: when the abort ended (monotonic).
    """

    def __init__(self, exc: BaseException, fence: Fence, aborted_at: float) -> None:
        self._exc: BaseException | None = exc
        self._fence = fence
        self._aborted_at = aborted_at

    def if_drained(self) -> None:
        """Release now if the drain is over (called from the barrier's wait)."""
        if time.monotonic() >= self._aborted_at + _DRAIN_S:
            self.now()

    def now(self) -> None:
        """Release now (after a sleep for what is left of the drain), unless done already."""
        exc, self._exc = self._exc, None
        if exc is not None:
            release(exc, self._fence, self._aborted_at)
