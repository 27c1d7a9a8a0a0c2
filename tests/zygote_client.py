"""The test side of tests/zygote.py: start pre-imported zygotes, fork jobs from them.

``zygote(modules)`` gives this test process's zygote for those imports, started on first use
and kept until the process exits (the leak checks in tests/conftest.py know it by its command
line, and still check every job it forks). A forked job is not a child of the test process, so
``ForkedJob`` gives the part of ``subprocess.Popen``'s interface the tests use (``pid``,
``args``, ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``), from the
zygote's answers on the job's own connection.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, BinaryIO

ZYGOTE = Path(__file__).resolve().with_name("zygote.py")
REPO = Path(__file__).resolve().parents[1]
#: The zygote's imports (torch, Lightning, DCP): generous, the machine may be busy.
READY_TIMEOUT_S = 180.0


#: Variables the fork applies to the job itself (tests/zygote.py, tests/forked_script.py).
_APPLIED_BY_FORK = {"PYTHONUNBUFFERED", "PYTHONPATH", "PYTHONFAULTHANDLER"}


class ZygoteError(RuntimeError):
    """The zygote did not start, or stopped answering for a job."""


class ForkedJob:
    """One job forked by the zygote. ``stdout`` is the read end of its output pipe, if it has
    one (as ``Popen(stdout=PIPE)``); ``text`` makes ``communicate`` decode it."""

    def __init__(
        self, args: list[str], conn: socket.socket, read_fd: int | None, text: bool
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        self.stdout: BinaryIO | None = None if read_fd is None else os.fdopen(read_fd, "rb", 0)
        self._text = text
        self._conn = conn
        self._buffer = b""
        self._chunks: list[bytes] = []
        message = self._message(READY_TIMEOUT_S)
        if message is None or "pid" not in message:
            self.release()
            raise ZygoteError(f"the zygote did not fork {args}: answered {message!r}")
        self.pid: int = message["pid"]

    def _message(self, timeout: float | None) -> dict | None:
        """The zygote's next line on this job's connection, or None when ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], remaining)[0]:
                return None
            data = self._conn.recv(4096)
            if not data:
                raise ZygoteError(f"the zygote closed the connection of job {self.args}")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            message = self._message(timeout)
            if message is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = int(message["returncode"])
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0.0)
        return None

    def communicate(self, timeout: float | None = None) -> tuple[str | bytes | None, None]:
        """Read the output to its end and wait for the job, as ``Popen.communicate``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.stdout is not None and not self.stdout.closed:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.stdout], [], [], remaining)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            data = os.read(self.stdout.fileno(), 65536)
            if data:
                self._chunks.append(data)
            else:
                self.stdout.close()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(remaining)
        if self.stdout is None:
            return None, None
        out = b"".join(self._chunks)
        return (out.decode(errors="replace") if self._text else out), None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def release(self) -> None:
        """Close this side's connection and output (after the job was killed and reaped)."""
        self._conn.close()
        if self.stdout is not None:
            self.stdout.close()


class Zygote:
    """A started tests/zygote.py; ``fork`` starts a job from it, ``stop`` ends it and its jobs."""

    def __init__(self, sock_dir: Path, modules: list[str], cwd: Path) -> None:
        self.path = sock_dir / "zygote.sock"
        self.cwd = cwd
        self.env = dict(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, str(ZYGOTE), str(self.path), ",".join(modules)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
        assert self._proc.stdout is not None
        # Raw reads: a buffered readline could hold "ready" in its buffer while select waits.
        said = b""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not said.endswith(b"ready\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._proc.stdout], [], [], remaining)[0]:
                self.stop()
                raise ZygoteError(f"zygote not ready in {READY_TIMEOUT_S} s: {said!r}")
            data = os.read(self._proc.stdout.fileno(), 4096)
            if not data:
                self.stop()
                raise ZygoteError(f"zygote exited before it was ready: {said!r}")
            said += data

    def can_fork(self, env: dict[str, str]) -> bool:
        """Whether a job with ``env`` runs as it would in a fresh interpreter once forked.

        The interpreter reads its ``PYTHON*`` variables at start-up: a job whose values differ
        from the zygote's needs a fresh interpreter, except ``PYTHONUNBUFFERED``,
        ``PYTHONFAULTHANDLER`` and ``PYTHONPATH``, which the fork applies itself.
        """
        names = {n for n in (*env, *self.env) if n.startswith("PYTHON")} - _APPLIED_BY_FORK
        return all(env.get(name) == self.env.get(name) for name in names)

    def fork(
        self,
        argv: list[str],
        env: dict[str, str],
        out_fd: int,
        read_fd: int | None = None,
        text: bool = False,
    ) -> ForkedJob:
        """Fork ``python ARGV`` with ``env``; its stdout and stderr go to ``out_fd``.

        ``read_fd``, the read end of a pipe whose write end is ``out_fd``, becomes the job's
        ``stdout``; the job owns it from here on.
        """
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.path))
            request = {"argv": argv, "env": env, "cwd": str(self.cwd)}
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [out_fd])
        except OSError as exc:
            conn.close()
            if read_fd is not None:
                os.close(read_fd)
            raise ZygoteError(f"could not reach the zygote at {self.path}: {exc}") from exc
        return ForkedJob(argv, conn, read_fd, text)

    def stop(self) -> None:
        """Close its stdin (it kills its jobs and exits); SIGKILL it after 30 s."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._proc.stdout.close()


#: What torchrun and ft-launcher import before they parse their flags (1.2 s of CPU here, after
#: torch's 1.7): torch's elastic agent. Nothing of ours, so that a forked torchrun stays plain.
LAUNCHERS = ("torch", "torch.distributed.run")

#: What the checkpoint tests' ranks import (tests/checkpoint/rank_group.py forks them): torch,
#: DCP (1.0 s of CPU: sympy, through DTensor), the optimizer's torch._dynamo (1.0 s) and ours.
RANK_GROUPS = ("torch", "torch.distributed.checkpoint", "torch._dynamo", "resiliency.checkpoint")

_ZYGOTES: dict[tuple[str, ...], Zygote] = {}


def zygote(modules: tuple[str, ...]) -> Zygote:
    """This process's zygote that imported ``modules``, started on first use (jobs run in REPO)."""
    if modules not in _ZYGOTES:
        sock_dir = Path(tempfile.mkdtemp(prefix="zygote-"))
        _ZYGOTES[modules] = Zygote(sock_dir, list(modules), REPO)
        atexit.register(shutil.rmtree, sock_dir, ignore_errors=True)
        atexit.register(_ZYGOTES[modules].stop)
    return _ZYGOTES[modules]


def start_python(
    modules: tuple[str, ...],
    argv: list[str],
    env: dict[str, str],
    stdout: int | IO[Any] | None = None,
    text: bool = False,
    cwd: Path = REPO,
) -> subprocess.Popen[Any] | ForkedJob:
    """``python ARGV`` (a script or ``-m MODULE``, then its arguments) in its own session, with
    its stderr on its stdout: forked from the zygote of ``modules`` when it can be, else a
    fresh interpreter (``Zygote.can_fork``).

    ``stdout`` is ``subprocess.PIPE``, a file (object or descriptor), or None (this process's).
    """
    forks = zygote(modules)
    if cwd != forks.cwd or not forks.can_fork(env):
        return subprocess.Popen(
            [sys.executable, *argv],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            text=text,
            start_new_session=True,
        )
    if stdout == subprocess.PIPE:
        read_fd, write_fd = os.pipe()
        try:
            return forks.fork(argv, env, write_fd, read_fd, text)
        finally:
            os.close(write_fd)
    out_fd = 1 if stdout is None else stdout if isinstance(stdout, int) else stdout.fileno()
    return forks.fork(argv, env, out_fd, None, text)
