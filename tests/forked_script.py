"""Run a Python script as ``__main__`` in a child forked from a pre-imported test process.

Shared by the two test helpers that fork jobs instead of starting fresh interpreters
(tests/checkpoint/rank_group.py, tests/zygote.py); both run as scripts and put this directory on
``sys.path`` to import it. What a fresh ``python SCRIPT ARGS`` would do that a
fork does not is done here: unbuffered streams under ``PYTHONUNBUFFERED``, the fault handler
under ``PYTHONFAULTHANDLER``, a fresh ``random``
seed, ``sys.argv`` and ``sys.path[0]`` of the script, and at the end the interpreter's exit steps
(join non-daemon threads, atexit handlers, flush) before ``os._exit``, which skips the
interpreter's teardown of torch (seconds on a busy machine).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import io
import os
import random
import runpy
import sys
import threading
import traceback
from pathlib import Path
from typing import NoReturn


def run_script_and_exit(argv: list[str]) -> NoReturn:
    """Run ``argv[0]`` with arguments ``argv[1:]`` as ``__main__``; exit with its code.

    ``argv`` may also start with ``-m MODULE``, as ``python -m MODULE ARGS`` (``sys.path[0]`` is
    then the working directory and ``sys.argv[0]`` the module's file, as Python sets them).
    """
    code = 1
    try:
        if os.environ.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(line_buffering=True, write_through=True)
        if bool(os.environ.get("PYTHONFAULTHANDLER")) != faulthandler.is_enabled():
            if faulthandler.is_enabled():
                faulthandler.disable()
            else:
                faulthandler.enable(all_threads=True)
        random.seed()  # a new interpreter would seed it from the OS, not share the parent's
        module = argv[1] if argv[0] == "-m" else None
        if module is None:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)
        else:
            sys.argv = ["-m", *argv[2:]]  # runpy puts the module's file in sys.argv[0]
            sys.path[0] = os.getcwd()
        try:
            if module is None:
                runpy.run_path(argv[0], run_name="__main__")
            else:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code & 0xFF)
