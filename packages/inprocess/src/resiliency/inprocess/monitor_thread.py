"""Asynchronous exceptions between threads, under NVRx 0.4's ``inprocess.monitor_thread`` names.

NVRx's wrapper interrupts the training (main) thread with an exception set from its monitor
thread through CPython's ``PyThreadState_SetAsyncExc``. This package's wrapper interrupts it
with a real-time signal instead (see ``_interrupt``: a signal also ends a blocking system call),
so nothing here is used by ``Wrapper``; the module exists so that code and tests written against
NVRx's module keep working:

* :class:`RankShouldRestart`: the very class of :mod:`resiliency.inprocess.exception`;
* :func:`async_raise`: raise an exception class in another thread at its next bytecode;
* :func:`reraise_if_unraisable`: an exception that CPython could only report through
  :func:`sys.unraisablehook` (raised in a ``__del__``, a finalizer, a weakref callback) is
  raised again in the main thread, where it can be caught.

NVRx's ``MonitorThread``, ``delayed_async_raise`` and ``async_abort_main_thread`` are its
wrapper's internals and are not provided.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from resiliency.inprocess.exception import RankShouldRestart

__all__ = ["RankShouldRestart", "async_raise", "reraise_if_unraisable"]

log = logging.getLogger(__name__)

# Private prototypes rather than argtypes set on ``ctypes.pythonapi.PyThreadState_SetAsyncExc``:
# that attribute is one object shared by every user of ctypes in the process. PYFUNCTYPE keeps
# the GIL during the call, which the function requires.
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
# The same function with a pointer argument: ``None`` becomes NULL, which clears a pending
# exception (a ``py_object`` argument would pass Py_None instead).
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


def async_raise(
    tid: int, exc_type: type[BaseException], event: threading.Event | None = None
) -> None:
    """Raise ``exc_type`` in the thread whose identifier is ``tid``, asynchronously.

    The target thread raises it when it next runs Python bytecode: a thread blocked in C (a
    sleep, a lock, a collective) raises it only once the call returns. A later call before
    then replaces the pending exception. While the interpreter is finalizing nothing is raised.

    Args:
        tid: the target thread's ``threading.get_ident()`` (``Thread.ident``).
        exc_type: the exception class to raise (a class, not an instance: CPython raises it
            as if by ``raise exc_type``).
        event: if given, wait until it is set before raising (from a helper thread, this
            delays the raise until the caller sets the event).

    Raises:
        TypeError: ``tid`` is not an int or ``exc_type`` is not a ``BaseException`` subclass.
        RuntimeError: no thread of this interpreter has identifier ``tid``, or CPython reported
            more than one such thread (the request is then withdrawn).
    """
    if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
        raise TypeError(f"async_raise: tid must be a thread identifier (an int >= 0), got {tid!r}")
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        raise TypeError(
            f"async_raise: exc_type must be an exception class, got {exc_type!r} "
            f"({type(exc_type).__name__})"
        )
    if event is not None:
        event.wait()
    if sys.is_finalizing():
        log.debug("async_raise: interpreter finalizing, %s not raised", exc_type.__name__)
        return
    modified = _set_async_exc(tid, exc_type)
    if modified == 0:
        raise RuntimeError(
            f"async_raise: no thread with identifier {tid} in this interpreter "
            f"(it has ended, or it never existed); {exc_type.__name__} not raised"
        )
    if modified > 1:
        # CPython's contract: more than one thread state was modified; undo it.
        _clear_async_exc(tid, None)
        raise RuntimeError(
            f"async_raise: {modified} thread states matched identifier {tid}; "
            f"{exc_type.__name__} withdrawn"
        )
    log.debug("async_raise: %s set for thread %d", exc_type.__name__, tid)


class _ReraisingHook:
    """``sys.unraisablehook`` while :func:`reraise_if_unraisable` is active.

    It calls the hook it replaced, then, for an ``exc_type`` exception, starts a helper thread
    that raises ``exc_type`` in the main thread once the main thread has left this hook (an
    exception that arrives inside a hook is itself reported and lost).
    """

    def __init__(self, previous: Callable[[Any], object], exc_type: type[BaseException]) -> None:
        self.previous = previous
        self.exc_type = exc_type
        self._lock = threading.Lock()
        self._pending = False  # a helper thread will raise; a second report adds none

    def __call__(self, unraisable: Any) -> None:
        try:
            try:
                self.previous(unraisable)
            finally:
                reported = getattr(unraisable, "exc_type", None)
                if isinstance(reported, type) and issubclass(reported, self.exc_type):
                    self._schedule()
        except self.exc_type:
            # Our own raise landed in this hook (it would be reported and lost): again, later.
            self._schedule()

    def _schedule(self) -> None:
        if sys.is_finalizing():
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        log.debug("sys.unraisablehook: %s re-raised in the main thread", self.exc_type.__name__)
        helper = threading.Thread(
            target=self._raise_when_out_of_hook, name="reraise_if_unraisable", daemon=True
        )
        helper.start()

    def _raise_when_out_of_hook(self) -> None:
        main = threading.main_thread()
        try:
            while main.ident is not None and main.is_alive() and not sys.is_finalizing():
                if not _in_hook(sys._current_frames().get(main.ident)):
                    with self._lock:
                        self._pending = False
                    async_raise(main.ident, self.exc_type)
                    return
                time.sleep(sys.getswitchinterval())
        except RuntimeError:
            log.debug("reraise_if_unraisable: the main thread ended first", exc_info=True)
        with self._lock:
            self._pending = False


_HOOK_CODE = _ReraisingHook.__call__.__code__


def _in_hook(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _HOOK_CODE:
            return True
        frame = frame.f_back
    return False


def reraise_if_unraisable(
    exc_type: type[BaseException],
) -> contextlib._GeneratorContextManager[None]:
    """Raise again, in the main thread, an ``exc_type`` that CPython could only report.

    An exception that leaves a ``__del__`` method, a finalizer or a weakref callback cannot
    propagate: CPython passes it to :func:`sys.unraisablehook`, which prints it. Inside this
    block (or the decorated function) the hook is wrapped: it still runs, and for an exception
    of ``exc_type`` (or a subclass) the same class is then raised asynchronously in the main
    thread with :func:`async_raise`, at its next bytecode after the hook returned. Other
    exceptions are only reported, as before. The previous hook is restored on leaving, whatever
    the exit.

    Usable as a context manager (``with reraise_if_unraisable(RankShouldRestart): ...``) and as
    a decorator (``@reraise_if_unraisable(RankShouldRestart)``).

    Args:
        exc_type: the exception class to raise again.

    Returns:
        A context manager that is also a decorator (each decorated call wraps the hook anew).

    Raises:
        TypeError: ``exc_type`` is not a ``BaseException`` subclass (at once, not on entry).
    """
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        raise TypeError(
            f"reraise_if_unraisable: exc_type must be an exception class, got {exc_type!r}"
        )
    return _wrapped_unraisablehook(exc_type)


@contextlib.contextmanager
def _wrapped_unraisablehook(exc_type: type[BaseException]) -> Iterator[None]:
    previous = sys.unraisablehook
    sys.unraisablehook = _ReraisingHook(previous, exc_type)
    try:
        yield
    finally:
        sys.unraisablehook = previous
