"""A pre-imported process that forks test jobs: each skips the imports the zygote did once.

    python zygote.py SOCKET MODULE[,MODULE...]

Imports the MODULEs (torch, and what the jobs import next: Lightning, torch's elastic agent),
then serves forks on the AF_UNIX SOCKET. A request is one JSON line, ``{"argv": [...], "env":
{...}, "cwd": DIR}``, where argv is ``[SCRIPT, ARGS...]`` or ``["-m", MODULE, ARGS...]`` as
after ``python``, sent with one file descriptor (SCM_RIGHTS) that becomes the job's stdout and
stderr. The zygote forks a child that starts its own session (its pid is its process group, as
with ``Popen(start_new_session=True)``) and runs the script or module as ``__main__`` with
exactly ``env``. On the request's connection it answers ``{"pid": PID}`` at once and
``{"returncode": CODE}`` when the child ends (negative: the signal that killed it, as
``Popen.returncode``).

A job's CPU is then what it does, not the 2-5 s of imports before it (``import torch`` is 1.7 s
of CPU on this machine, ``import lightning.pytorch`` 3.9 s); ``ft-launcher --ft-preimport``
starts workers the same way. The zygote stays single-threaded (it checks after its imports): a
fork of a process with threads can deadlock the child. It prints ``ready`` when it serves, and
exits at the end of its stdin (its test process closed it, or exited) or when its parent is gone,
SIGKILLing the jobs still running. One difference from a fresh interpreter stays: a forked job's
``/proc/PID/cmdline`` and ``environ`` are the zygote's (Linux shows what the process started
with), so a test that reads them reads the job's own files instead.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from forked_script import run_script_and_exit  # its sibling: this script's folder leads sys.path

#: How often the loop looks for ended jobs and for its parent (a poll between requests).
_POLL_S = 0.05
_MAX_REQUEST = 1 << 20


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _read_request(conn: socket.socket) -> tuple[dict, int]:
    """One JSON line and the descriptor sent with its first bytes."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 1)
    while not data.endswith(b"\n"):
        more = conn.recv(65536)
        if not more or len(data) > _MAX_REQUEST:
            raise ValueError(f"zygote: truncated request ({len(data)} bytes)")
        data += more
    if len(fds) != 1:
        raise ValueError(f"zygote: a request needs one output descriptor, got {len(fds)}")
    return json.loads(data), fds[0]


def _entries(pythonpath: str) -> list[str]:
    return [os.path.abspath(entry) for entry in pythonpath.split(os.pathsep) if entry]


def _use_pythonpath(mine: str, wanted: str) -> None:
    """Give ``sys.path`` the job's ``PYTHONPATH`` entries in place of the zygote's.

    A fresh interpreter puts them right after the script's folder; a fork keeps the zygote's.
    (A module the zygote imported stays imported: the client forks only jobs that do not need
    another copy of those, see ``Zygote.can_fork``.)
    """
    if mine == wanted:
        return
    for entry in _entries(mine):
        if entry in sys.path:
            sys.path.remove(entry)
    sys.path[1:1] = _entries(wanted)
    importlib.invalidate_caches()


def _child(request: dict, out_fd: int, open_sockets: list[socket.socket]) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` in ``cwd`` with ``env``; never returns."""
    try:
        for sock in open_sockets:
            sock.close()
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the zygote's stdin is the test's line to stop it
        os.close(devnull)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.chdir(request["cwd"])
        _use_pythonpath(os.environ.get("PYTHONPATH", ""), request["env"].get("PYTHONPATH", ""))
        os.environ.clear()
        os.environ.update(request["env"])
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_script_and_exit(request["argv"])


def _send(conn: socket.socket, message: dict) -> None:
    # The test may have closed its end already (it killed the job and stopped waiting).
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


def serve(path: str) -> None:
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    jobs: dict[int, socket.socket] = {}
    print("ready", flush=True)
    try:
        while os.getppid() == parent:
            readable, _, _ = select.select([listener, sys.stdin], [], [], _POLL_S)
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
                break
            if listener in readable:
                conn, _ = listener.accept()
                try:
                    request, out_fd = _read_request(conn)
                except (OSError, ValueError) as exc:
                    print(f"zygote: bad request: {exc}", file=sys.stderr, flush=True)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, out_fd, [listener, conn, *jobs.values()])
                os.close(out_fd)
                jobs[pid] = conn
                _send(conn, {"pid": pid})
            while jobs:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = jobs.pop(pid)
                _send(conn, {"returncode": _returncode(status)})
                conn.close()
    finally:
        for pid in jobs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for pid in jobs:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        listener.close()


def main() -> None:
    path, modules = sys.argv[1], sys.argv[2]
    started = time.process_time()
    for name in filter(None, modules.split(",")):
        importlib.import_module(name)
    if threading.active_count() != 1:
        names = [t.name for t in threading.enumerate()]
        raise SystemExit(f"zygote: importing {modules} started threads {names}; cannot fork")
    print(f"zygote: imported {modules} in {time.process_time() - started:.1f} s of CPU")
    serve(path)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skips the interpreter's teardown of torch
