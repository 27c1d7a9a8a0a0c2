"""What a worker forked by the fork server does before and after the training script.

It becomes what ``python [-u] SCRIPT ARGS`` (or ``python [-u] -m MODULE ARGS``) would have
started: its own session (torch's launcher starts workers with ``start_new_session``), the
worker's environment and working directory, stdout/stderr on the files torch redirects them
to, Python's and NumPy's random seeds drawn afresh (a fork would otherwise share the server's),
then the script as ``__main__``. At the end it does what the interpreter does at exit: waits
for non-daemon threads, runs ``atexit`` handlers, flushes, and exits with the script's code.

Its environment is also published in ``$RESILIENCY_FORKED_ENVIRON_DIR/<pid>`` (see
``_fork_server_main``), since ``/proc/<pid>/environ`` still shows the server's.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import runpy
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from resiliency.launcher._contracts import FORKED_ENVIRON_DIR_ENV


def _command(argv: list[str]) -> tuple[bool, str, str, list[str]] | str:
    """Parse ``python [-u] (SCRIPT | -m MODULE) ARGS``: (unbuffered, kind, target, args)."""
    if not argv or argv[0] != sys.executable:
        return f"the entrypoint {argv[:1]} is not this Python ({sys.executable})"
    rest, unbuffered = list(argv[1:]), False
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        if rest[0] != "-u":
            return f"the Python option {rest[0]} is not supported by the fork server"
        unbuffered = True
        rest.pop(0)
    if not rest:
        return "no script to run"
    if rest[0] == "-m":
        if len(rest) < 2:
            return "-m without a module"
        return unbuffered, "module", rest[1], rest[2:]
    return unbuffered, "script", rest[0], rest[1:]


def check(request: dict[str, Any]) -> str:
    """Why the request cannot be served by a fork (empty when it can)."""
    argv, env = request.get("argv"), request.get("env")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "argv must be a list of strings"
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return "env must map strings to strings"
    parsed = _command(argv)
    return parsed if isinstance(parsed, str) else ""


def _publish_environ(directory: str, env: dict[str, str]) -> None:
    """Write ``env`` as ``directory/<pid>`` (atomically, readable by this user only)."""
    pid = os.getpid()
    tmp = Path(directory) / f".{pid}.tmp"
    data = b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0" for k, v in env.items())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, Path(directory) / str(pid))


def forget_environ(pid: int) -> None:
    """Remove what a reaped worker published (the server calls this)."""
    directory = os.environ.get(FORKED_ENVIRON_DIR_ENV)
    if directory:
        with contextlib.suppress(OSError):
            (Path(directory) / str(pid)).unlink()


def _redirect(path: Any, fd: int) -> None:
    if isinstance(path, str) and path:
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _as_if_fresh() -> None:
    """Undo what a fork shares with the server and a new interpreter would not have."""
    # A new interpreter seeds these from the OS; torch's generator starts from its fixed
    # default seed, which the fork already has.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # torch read it at import, in the server


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run(request: dict[str, Any], server_fd: int) -> None:
    """Run the worker of ``request`` in this (just forked) process; never returns."""
    code = 1
    try:
        os.close(server_fd)
        os.setsid()
        # The signal dispositions of a new interpreter (the server ignores the group's signals).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        parsed = _command(request["argv"])
        assert not isinstance(parsed, str)  # checked by the server before the fork
        unbuffered, kind, target, args = parsed
        published = os.environ.get(FORKED_ENVIRON_DIR_ENV)
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        _redirect(request.get("stdout"), 1)
        _redirect(request.get("stderr"), 2)
        if published:
            try:
                _publish_environ(published, request["env"])
            except OSError as exc:  # only tools outside the job lose sight of this worker
                print(
                    f"ft-launcher fork server: cannot publish the environment: {exc}",
                    file=sys.stderr,
                )
        if unbuffered or os.environ.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(line_buffering=True, write_through=True)
        _as_if_fresh()
        sys.argv = [target, *args]
        try:
            if kind == "module":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.path[0] = os.path.dirname(os.path.abspath(target))
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:
            # As a new interpreter does: the script's own hook (a configuration error's sets
            # the exit code itself, see resiliency.launcher._config_error) prints it.
            sys.excepthook(*sys.exc_info())
            code = 1
        main = threading.main_thread()
        for thread in threading.enumerate():
            if thread is not main and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken stream
                stream.flush()
        os._exit(code & 0xFF)
