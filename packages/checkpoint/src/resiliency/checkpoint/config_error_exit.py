"""What a rank and ft-launcher agree on for a configuration error: the rank exits 78.

A configuration error (a checkpoint directory the job cannot write, an auto-resume flag file
nobody named) fails every restart the same way, so restarting only burns the allocation. A rank
whose configuration error goes uncaught exits with ``CONFIG_ERROR_EXIT_CODE`` (78, ``EX_CONFIG``
in ``sysexits.h``) instead of Python's 1; ft-launcher (``resiliency.launcher._config_error``, the
other side: neither imports the other) then stops the job without restarting it and exits 2
(``USAGE``): the requeue script reads "fix the configuration", not "requeue".

An error is a configuration error once it has been passed to :func:`config_error`; code that
catches it is unaffected. The process exits 78 only when the error ends it uncaught, through a
``sys.excepthook`` installed the first time an error is marked (it chains the previous hook,
which still prints the traceback).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from types import TracebackType
from typing import TypeVar

__all__ = ["CONFIG_ERROR_EXIT_CODE", "config_error"]

#: The exit code of a rank that ended on a configuration error (``EX_CONFIG``).
CONFIG_ERROR_EXIT_CODE = 78

_MARK = "_resiliency_config_error"
_E = TypeVar("_E", bound=BaseException)
_installed = threading.Lock()
_previous_hook = sys.excepthook


def config_error(exc: _E) -> _E:
    """Mark ``exc`` as a configuration error: uncaught, it makes the process exit 78.

    Args:
        exc: the error about to be raised.

    Returns:
        ``exc`` itself, for ``raise config_error(SomeError(...))``.
    """
    setattr(exc, _MARK, True)
    _install_hook()
    return exc


def _install_hook() -> None:
    global _previous_hook  # one hook per process, installed once
    with _installed:
        if sys.excepthook is not _exit_on_config_error:
            _previous_hook = sys.excepthook
            sys.excepthook = _exit_on_config_error


def _is_config_error(exc: BaseException | None) -> bool:
    """True when ``exc`` or an error it was raised from or during is marked."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if getattr(exc, _MARK, False):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _exit_on_config_error(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    _previous_hook(kind, exc, tb)
    if not _is_config_error(exc):
        return
    print(
        f"exiting with code {CONFIG_ERROR_EXIT_CODE} (a configuration error: a restart fails the "
        "same way; fix the configuration named above and start the job again)",
        file=sys.stderr,
    )
    # What the interpreter does on its way out, then the code it has no way to take: the
    # non-daemon threads finish, the atexit handlers run (logging flushes), stdio is flushed.
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream
            stream.flush()
    os._exit(CONFIG_ERROR_EXIT_CODE)
