"""Inject a fault into some ranks of a running job, after a delay (NVRx's ``inject_fault``).

Every rank calls :func:`inject_fault` with the same arguments and seed; each draws the same
choice from the seed (how many ranks, which ones, which fault, when), and the chosen ranks
start the fault in a background thread after the delay. The first ``keep_alive`` ranks are
never chosen. What each fault does:

* ``ASYNC_EXC``: :class:`InjectedException` raised in the main thread at its next bytecode;
* ``SIGNAL_EXC``: SIGUSR1, whose handler (installed now) raises :class:`InjectedException`;
* ``KILL``, ``TERM``, ``INT``, ``STOP``: that signal to this process;
* ``ABORT``: ``os.abort()`` (SIGABRT, a core dump where enabled);
* ``SEGFAULT``: a read of address 0;
* ``GIL``: a C call that sleeps holding the GIL (only the monitor process can end it);
* ``GPU``: an out-of-bounds index on the current CUDA device (a device-side assert that
  breaks the CUDA context); ``GPU_SLEEP``: a kernel that spins for good on it (both need CUDA).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from resiliency.inprocess.monitor_thread import async_raise

__all__ = ["Fault", "InjectedException", "inject_fault"]

log = logging.getLogger(__name__)


class Fault(enum.Enum):
    """The faults :func:`inject_fault` can inject (NVRx's members)."""

    GPU = enum.auto()
    GPU_SLEEP = enum.auto()
    ASYNC_EXC = enum.auto()
    SIGNAL_EXC = enum.auto()
    ABORT = enum.auto()
    GIL = enum.auto()
    SEGFAULT = enum.auto()
    INT = enum.auto()
    KILL = enum.auto()
    TERM = enum.auto()
    STOP = enum.auto()


class InjectedException(Exception):  # noqa: N818 - NVRx's name
    """The exception of the ``ASYNC_EXC`` and ``SIGNAL_EXC`` faults."""


_SIGNALS = {
    Fault.KILL: signal.SIGKILL,
    Fault.TERM: signal.SIGTERM,
    Fault.INT: signal.SIGINT,
    Fault.STOP: signal.SIGSTOP,
    Fault.SIGNAL_EXC: signal.SIGUSR1,
}
_GPU_FAULTS = frozenset({Fault.GPU, Fault.GPU_SLEEP})


def inject_fault(  # noqa: PLR0917 - NVRx's signature, positional as there
    faults: Fault | Sequence[Fault],
    num_faults: int | tuple[int, int],
    keep_alive: int,
    delay: float | tuple[float, float],
    seed: int,
    callback: Callable[[], Any] | None = None,
) -> None:
    """Choose ranks from ``seed`` and start one fault on each of them after ``delay``.

    Args:
        faults: the fault, or the faults one is drawn from.
        num_faults: how many ranks, or the (min, max) range it is drawn from; at most the ranks
            not kept alive.
        keep_alive: ranks ``0 .. keep_alive - 1`` are never chosen.
        delay: seconds until the fault, or the (min, max) range it is drawn from.
        seed: the same on every rank, so that all draw the same choice (add the restart
            iteration to get a new one at each restart).
        callback: called on a chosen rank just before its fault.

    Raises:
        ValueError: no fault given, or a GPU fault drawn on a machine without CUDA.
    """
    choices = [faults] if isinstance(faults, Fault) else list(faults)
    if not choices:
        raise ValueError("inject_fault(faults=...): give at least one Fault")
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    draw = random.Random(seed)  # noqa: S311 (the same draw on every rank, not security)
    low, high = (num_faults, num_faults) if isinstance(num_faults, int) else num_faults
    wait = delay if isinstance(delay, (int, float)) else draw.uniform(*delay)
    count = max(0, min(draw.randint(low, high), world_size - keep_alive))
    chosen = draw.sample(range(keep_alive, world_size), count)
    fault = draw.choice(choices)
    if rank not in chosen:
        return
    if fault in _GPU_FAULTS and not torch.cuda.is_available():
        raise ValueError(f"inject_fault: {fault.name} needs a CUDA device; this rank has none")
    log.critical(
        "rank %d: injecting %s in %.3f s (seed %d; ranks %s)", rank, fault.name, wait, seed, chosen
    )
    if fault is Fault.SIGNAL_EXC:
        signal.signal(signal.SIGUSR1, _raise_injected)
    target = threading.main_thread().ident
    thread = threading.Thread(
        target=_after, args=(wait, callback, fault, target), name="inject-fault", daemon=True
    )
    thread.start()


def _raise_injected(signum: int, frame: object) -> None:
    raise InjectedException(f"injected by signal {signal.Signals(signum).name}")


def _after(wait: float, callback: Callable[[], Any] | None, fault: Fault, target: int) -> None:
    time.sleep(wait)
    log.critical("injecting %s now", fault.name)
    if callback is not None:
        callback()
    if fault in _SIGNALS:
        os.kill(os.getpid(), _SIGNALS[fault])
    elif fault is Fault.ASYNC_EXC:
        async_raise(target, InjectedException)
    elif fault is Fault.ABORT:
        os.abort()
    elif fault is Fault.SEGFAULT:
        ctypes.string_at(0)
    elif fault is Fault.GIL:
        ctypes.PyDLL(None).sleep(1 << 30)  # PyDLL: the GIL stays held during the call
    elif fault is Fault.GPU:
        index = torch.ones(1, dtype=torch.int64, device="cuda")
        torch.zeros(1, device="cuda")[index] = 1  # out of bounds: a device-side assert
        torch.cuda.synchronize()
    else:  # GPU_SLEEP
        torch.cuda._sleep(1 << 62)
