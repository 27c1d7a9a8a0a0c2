"""The opt-in hook through which ``resiliency-simulate`` makes a rank hang or crash from outside.

Killing or stopping a rank needs nothing from it, but a hang that holds the GIL, a hang that
releases it, and a crash with a Python exception must run inside the rank. With
``RESILIENCY_FAULT_HOOK=1`` in its environment, the rank's ``RankMonitorClient`` installs handlers
for three real-time signals (SIGRTMIN+1..3); without it nothing is installed and nothing costs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
from types import FrameType

__all__ = ["FAULT_HOOK_ENV", "FAULT_HOOK_SIGNALS", "SimulatedCrash", "install_fault_hook"]

logger = logging.getLogger(__name__)

#: The environment variable that turns the hook on.
FAULT_HOOK_ENV = "RESILIENCY_FAULT_HOOK"
#: Fault kind -> offset from SIGRTMIN (the simulator sends these).
FAULT_HOOK_SIGNALS = {"hang": 1, "hang_nogil": 2, "crash": 3}
_HANG_SECONDS = 24 * 3600
_installed = False


class SimulatedCrash(Exception):  # noqa: N818 - named for what users see in the traceback
    """Raised inside a rank by an injected ``crash`` fault.

    Not a ``RuntimeError``: the signal lands wherever the main thread is, often inside library
    code that retries a flaky store on ``RuntimeError`` (torch's store errors are ones), which
    would take the injected crash for a store hiccup and train on.
    """


def _sleep_through_signals(libc: ctypes.CDLL) -> None:
    # libc's sleep() returns early, with the seconds left, whenever a signal handler runs: the
    # monitor's stack-dump request would end the hang it is diagnosing, and the rank would train
    # on. A real hang outlasts signals; only SIGKILL (or the stop's escalation) ends this one.
    left = _HANG_SECONDS
    while left > 0:
        left = libc.sleep(left)


def _hang_holding_gil(signum: int, frame: FrameType | None) -> None:
    logger.warning("fault hook: hanging with the GIL held (signal %d)", signum)
    # PyDLL keeps the GIL during the call: no Python thread of this rank runs again.
    _sleep_through_signals(ctypes.PyDLL(None))


def _hang_releasing_gil(signum: int, frame: FrameType | None) -> None:
    logger.warning("fault hook: hanging with the GIL released (signal %d)", signum)
    # CDLL releases the GIL: background threads (heartbeat threads included) keep running.
    _sleep_through_signals(ctypes.CDLL(None))


def _crash(signum: int, frame: FrameType | None) -> None:
    raise SimulatedCrash(f"crash injected by resiliency-simulate (signal {signum})")


def install_fault_hook() -> bool:
    """Install the fault handlers when ``RESILIENCY_FAULT_HOOK=1``; idempotent.

    Returns:
        Whether the hook is installed (False when not asked for, or off the main thread).
    """
    global _installed
    if _installed:
        return True
    if os.environ.get(FAULT_HOOK_ENV) != "1":
        return False
    if threading.current_thread() is not threading.main_thread():
        logger.warning("%s=1 but not on the main thread: fault hook not installed", FAULT_HOOK_ENV)
        return False
    handlers = {"hang": _hang_holding_gil, "hang_nogil": _hang_releasing_gil, "crash": _crash}
    for kind, offset in FAULT_HOOK_SIGNALS.items():
        signal.signal(signal.SIGRTMIN + offset, handlers[kind])
    _installed = True
    logger.info("fault hook installed (pid %d): simulated hang, hang_nogil and crash", os.getpid())
    return True
