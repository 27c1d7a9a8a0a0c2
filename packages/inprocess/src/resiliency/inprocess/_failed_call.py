"""What is left of a failed call: whether its error echoes a peer's fault, and its objects."""

from __future__ import annotations

import gc
import traceback

import torch.distributed as dist


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


def release(exc: BaseException, fence: Fence) -> None:
    """Free what the failed call's frames hold (its DDP model, its process group).

    Right after the abort is safe: a gloo group's destructor joins its worker threads, which
    may still be finishing the aborted work and need the GIL for it, but torch destroys a
    ``ProcessGroup`` with the GIL released (its pybind holder, ``IntrusivePtrNoGilDestructor``:
    seen in the native stack of a destructor waiting on a worker, torch 2.13). The collection
    runs while ``fence`` is closed: it scans the call's objects only.
    """
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None  # the frames' own references to each other
    try:
        while gc.collect():
            pass
    finally:
        fence.open()


class PendingRelease:
    """A failed call's :func:`release`, run once, as early as it may: while the restart
    barrier waits for a member (a respawned rank, say), else right after the barrier. Not
    before this rank arrived there: a destructor that waits on a gloo worker must not keep the
    others from seeing it arrive.

    Args:
        exc: the failed call's exception.
        fence: the fence closed before the call.
    """

    def __init__(self, exc: BaseException, fence: Fence) -> None:
        self._exc: BaseException | None = exc
        self._fence = fence

    def now(self) -> None:
        """Release now, unless done already."""
        exc, self._exc = self._exc, None
        if exc is not None:
            release(exc, self._fence)
