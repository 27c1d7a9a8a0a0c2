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


def release(exc: BaseException) -> None:
    """Free what the failed call's frames hold (its DDP model, its process group).

    Not earlier than the restart barrier: gloo's worker threads finish the aborted work and
    then need the GIL; a process group destroyed while one of them does deadlocks (torch 2.13:
    its destructor joins the thread with the GIL held). By the end of the barrier they are
    idle; the short sleep covers a barrier that all ranks passed at once.
    """
    time.sleep(_DRAIN_S)
    traceback.clear_frames(exc.__traceback__)
    while gc.collect():
        pass
