"""The fork server: a process that imports the workers' heavy modules once and forks workers.

    python -m resiliency.launcher._fork_server_main FD MODULE[,MODULE...]

Started by ft-launcher with ``--ft-preimport`` and kept across restarts. It imports the given
modules, then serves requests on the socket ``FD`` (length-prefixed JSON, never pickle):

- ``{"t": "spawn", "argv": [...], "env": {...}, "cwd": ..., "stdout": path|null,
  "stderr": path|null}`` -> ``{"t": "spawned", "pid": N}`` or ``{"t": "refused", "why": ...}``;
- it sends ``{"t": "exit", "pid": N, "code": C}`` when a worker ends (``C`` as Popen's
  ``returncode``: negative for a signal).

It stays single-threaded (a fork from a process with other threads can deadlock the child) and
ends when the launcher's end of the socket closes, or the launcher dies.

Linux keeps, in ``/proc/<pid>/environ``, the environment a process was executed with, so a
forked worker shows the server's there. Tools that find ranks from outside (the simulator)
read the worker's own environment from ``$RESILIENCY_FORKED_ENVIRON_DIR/<pid>`` instead (same
format: ``KEY=VALUE`` entries, each ending in a NUL byte). The worker writes that file before it
runs the script; the server removes it when it reaps the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import select
import signal
import socket
import sys
from typing import Any

from resiliency.launcher import _forked_worker
from resiliency.launcher._frames import recv_frame, send_frame

_PR_SET_PDEATHSIG = 1
_GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher is already gone
        os._exit(1)


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _forked_worker.forget_environ(pid)
        send_frame(sock, {"t": "exit", "pid": pid, "code": _returncode(status)})


class _ExitWakeup:
    """A pipe that SIGCHLD writes to (``signal.set_wakeup_fd``), so the serving loop wakes the
    moment a worker exits: the launcher waits for this server's reap before it acts on a dead
    worker (a respawn), and a 50 ms poll made it wait 25 ms on average."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)
        signal.signal(signal.SIGCHLD, self._ignore)  # a handler, not SIG_IGN: that auto-reaps
        signal.set_wakeup_fd(self._write_fd)

    @staticmethod
    def _ignore(signum: int, frame: object) -> None:
        """The wakeup byte is the point; the handler itself has nothing to do."""

    def drain(self) -> None:
        """Read the bytes the signals wrote (the reap that follows looks at every child)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 512):
                pass

    def close_in_worker(self) -> None:
        """In a forked worker: the defaults of a new interpreter back, the pipe closed."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.read_fd)
        os.close(self._write_fd)


def _spawn(sock: socket.socket, request: dict[str, Any], wakeup: _ExitWakeup) -> None:
    problem = _forked_worker.check(request)
    if problem:
        send_frame(sock, {"t": "refused", "why": problem})
        return
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        wakeup.close_in_worker()
        _forked_worker.run(request, sock.fileno())
    send_frame(sock, {"t": "spawned", "pid": pid})


def serve(sock: socket.socket) -> int:
    """Answer requests until the launcher closes its end; return the exit code."""
    wakeup = _ExitWakeup()
    while True:
        _reap(sock)
        # The timeout is a fallback only: a worker's exit wakes the select through the pipe.
        ready, _, _ = select.select([sock.fileno(), wakeup.read_fd], [], [], 0.05)
        if wakeup.read_fd in ready:
            wakeup.drain()
        if sock.fileno() not in ready:
            continue
        try:
            request = recv_frame(sock)
        except (ValueError, OSError) as exc:
            print(f"ft-launcher fork server: bad request: {exc}", file=sys.stderr)
            return 1
        if request is None:
            return 0
        if request.get("t") == "spawn":
            _spawn(sock, request, wakeup)


def main(argv: list[str] | None = None) -> int:
    """Import the modules, then serve (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m resiliency.launcher._fork_server_main FD MODULES", file=sys.stderr)
        return 2
    _die_with_parent()
    # A signal to the launcher's process group (a scheduler stopping the node) is for the
    # launcher: the server must live on to report its workers' exits, and ends with the
    # launcher (its socket's end, or the parent-death signal). Workers get the defaults back.
    for signum in _GROUP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    sock = socket.socket(fileno=int(args[0]))
    for name in filter(None, args[1].split(",")):
        importlib.import_module(name)
    send_frame(sock, {"t": "ready", "pid": os.getpid()})
    try:
        return serve(sock)
    finally:
        sock.close()


if __name__ == "__main__":
    exit_code = main()
    # The interpreter's teardown of what was preimported (torch, Lightning: seconds on a busy
    # node) is skipped; the launcher's exit, and so a preempted node's, waits for this process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
