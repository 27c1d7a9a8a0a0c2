"""The rank's side of its persistent writer process: spawn, hand over the arena, send, wait.

The writer is started with ``subprocess`` as ``python .../_writer/__main__.py FD RANK_PID``
(the spawn semantics, without multiprocessing's re-import of the user's ``__main__``), inherits
only its end of a socketpair, and never sees CUDA (``CUDA_VISIBLE_DEVICES`` is emptied for it).
The entry runs by its path, not with ``-m``, so that it sets its parent-death signal before
anything imports torch (see ``__main__``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from resiliency.checkpoint._writer import protocol as _protocol

logger = logging.getLogger(__name__)


#: The writer's entry, a file that imports only the standard library before its parent-death
#: signal is set.
WRITER_ENTRY = Path(__file__).with_name("__main__.py")

# A writer's start-up is imports only, but slow on a loaded node: bounded on its own, not by
# the save timeout.
STARTUP_TIMEOUT_S = 120.0


class WriterDiedError(RuntimeError):
    """The writer process exited."""


class WriterHungError(TimeoutError):
    """The writer did not answer before the deadline."""


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class WriterProcess:
    """One writer process; respawned by the manager when it dies."""

    def __init__(self) -> None:
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = "1"
        try:
            self._proc = subprocess.Popen(
                [sys.executable, str(WRITER_ENTRY), str(child.fileno()), str(os.getpid())],
                pass_fds=[child.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
                # Its own session: a SIGTERM to the rank's process group (a launcher stopping or
                # preempting the workers) must not kill the save the rank is waiting for. It
                # still ends with the rank: at its socket's EOF, or by its parent-death signal.
                start_new_session=True,
            )
        finally:
            child.close()
        self.pid = self._proc.pid
        self.ready = False
        self.arena_generation = -1
        logger.debug("checkpoint writer started (pid %d)", self.pid)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def describe_exit(self) -> str:
        try:
            self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "still running"
        return _exit_text(self._proc.returncode)

    def wait_ready(self, deadline: float) -> None:
        """Wait for the writer's ``ready`` (its imports are done); raise when it died or hung."""
        if self.ready:
            return
        reply = self.recv(deadline)
        if reply.get("type") != "ready" or reply.get("version") != _protocol.PROTOCOL_VERSION:
            raise _protocol.ProtocolError(
                f"writer speaks protocol {reply.get('version')!r}, this rank "
                f"{_protocol.PROTOCOL_VERSION}"
            )
        self.ready = True

    def poll_ready(self) -> bool:
        """Whether the writer is ready, without waiting (reads its ``ready`` if it came)."""
        if not self.ready:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if readable:  # its ready (or its EOF: wait_ready then raises WriterDiedError)
                self.wait_ready(time.monotonic() + 5.0)
        return self.ready

    def send_arena(self, fd: int, size: int, generation: int) -> None:
        self._send({"type": "arena", "size": size})
        try:
            _protocol.send_fd(self._sock, fd)
        except OSError as exc:
            raise WriterDiedError(f"writer (pid {self.pid}) is gone: {exc}") from None
        self.arena_generation = generation

    def send(self, message: dict[str, Any]) -> None:
        self._send(message)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            _protocol.send(self._sock, message)
        except OSError as exc:
            raise WriterDiedError(
                f"writer (pid {self.pid}) is gone ({self.describe_exit()}): {exc}"
            ) from None

    def recv(self, deadline: float) -> dict[str, Any]:
        """Receive the next reply; WriterDiedError at EOF, WriterHungError at the deadline."""
        try:
            return _protocol.recv(self._sock, deadline)
        except _protocol.PeerClosedError:
            raise WriterDiedError(f"writer (pid {self.pid}) {self.describe_exit()}") from None
        except _protocol.ReplyTimeoutError:
            raise WriterHungError(
                f"writer (pid {self.pid}) gave no answer within the deadline"
            ) from None

    def kill(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        try:
            self._proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie in D state
            logger.error("writer pid %d did not exit after SIGKILL", self.pid)
        self._sock.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the writer: a ready one is asked to exit, one still starting is killed at once.

        The managers close a writer only once no save is in flight on it. One that never said
        ``ready`` was never sent a request and holds nothing, but would read ``exit`` only
        after its imports: seconds on a busy node at its lowered priority, during which a rank
        closing its manager on its way out (an emergency stop) sends no heartbeat, and its
        monitor took that wait for a hang. A ready, idle writer exits at once on ``exit``.

        Args:
            timeout: how long a ready writer gets to exit before it is killed.
        """
        if self._proc.poll() is None and self.ready:
            try:
                _protocol.send(self._sock, {"type": "exit"})
                self._proc.wait(timeout=timeout)
            except OSError as exc:  # its end is closed: it is exiting (kill() reaps it)
                logger.debug("writer pid %d: 'exit' not sent: %s", self.pid, exc)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "checkpoint writer pid %d did not exit within %.1f s of 'exit'; killing it",
                    self.pid,
                    timeout,
                )
        self.kill()

    @staticmethod
    def deadline(seconds: float) -> float:
        return time.monotonic() + seconds
