"""MonitorProcess: start one rank monitor as a subprocess and act as its controller.

The launcher (and the demo) holds one :class:`MonitorProcess` per local rank. It tells the monitor
when a worker is spawned (which arms the initial-heartbeat timer before the worker has imported
anything) and receives the monitor's events: hangs, kills, workload-control requests, connects
and disconnects. When the controller goes away, the monitor exits too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from resiliency.ft._peer import connect, recv_message, request
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.errors import MonitorUnavailableError, ProtocolError
from resiliency.ft.socket_dir import check_socket_path, ensure_private_dir, stack_dump_path_for

__all__ = ["MonitorEvent", "MonitorProcess"]

logger = logging.getLogger(__name__)

_REQUEST_TIMEOUT_S = 5.0
_CONNECT_POLL_S = 0.02


@dataclass(frozen=True)
class MonitorEvent:
    """Something the monitor reports to its controller.

    Attributes:
        kind: ``"hang"``, ``"killed"``, ``"stacks"`` (the answer to
            :meth:`MonitorProcess.request_stack_dump`), ``"wlc"``, ``"rank_connected"`` or
            ``"rank_disconnected"``.
        local_rank: The monitor's local rank.
        rank: The worker's global rank, if known.
        pid: The worker's pid.
        timer: For hang/killed: which timer expired (``"initial"``, ``"heartbeat"``,
            ``"section:<name>"``, ``"out_of_section"``).
        elapsed: For hang: seconds since the timer started.
        limit: For hang: the timeout.
        stack_dump: For hang: the rank's stack dump (None if there was none).
        signal: For killed: the signal that ended the worker (None if it exited by itself).
        action: For wlc: the requested action name.
        desc: For wlc: the rank's description.
        raw: The whole message.
    """

    kind: str
    local_rank: int | None = None
    rank: int | None = None
    pid: int | None = None
    timer: str | None = None
    elapsed: float | None = None
    limit: float | None = None
    stack_dump: str | None = None
    signal: str | None = None
    action: str | None = None
    desc: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> MonitorEvent:
        """Build an event from a validated ``event`` message."""
        names = (
            "local_rank",
            "rank",
            "pid",
            "timer",
            "elapsed",
            "limit",
            "stack_dump",
            "signal",
            "action",
            "desc",
        )
        return cls(kind=msg["kind"], **{n: msg.get(n) for n in names}, raw=dict(msg))


class MonitorProcess:
    """A running rank monitor subprocess and the controller connection to it.

    Build one with :meth:`start`. Methods may be called from one thread at a time (a lock
    serializes them).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        sock: socket.socket,
        socket_path: Path,
        local_rank: int,
        cfg: FaultToleranceConfig,
    ) -> None:
        self._popen = popen
        self._sock: socket.socket | None = sock
        self.socket_path = socket_path
        self.local_rank = local_rank
        self.cfg = cfg
        self._events: deque[MonitorEvent] = deque()
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls,
        cfg: FaultToleranceConfig,
        socket_path: str | os.PathLike[str],
        local_rank: int,
        *,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 10.0,
        stderr: int | IO[Any] | None = None,
    ) -> MonitorProcess:
        """Spawn ``python -m resiliency.ft.server`` and connect to it as its controller.

        Args:
            cfg: The configuration the monitor runs with.
            socket_path: The monitor's socket; its directory must be private (mode 0700; created
                if missing).
            local_rank: The local rank it serves.
            env: The monitor's environment (default: this process's).
            start_timeout: Seconds to wait until the monitor accepts connections.
            stderr: Where the monitor's log goes (default: this process's stderr).

        Returns:
            The connected monitor.

        Raises:
            ConfigError: The socket path is too long or its directory is not private.
            MonitorUnavailableError: The monitor exited or did not listen within the timeout.
        """
        path = Path(check_socket_path(socket_path))
        ensure_private_dir(path.parent)
        argv = [
            sys.executable,
            "-m",
            "resiliency.ft.server",
            "--socket",
            str(path),
            "--local-rank",
            str(local_rank),
            "--config-json",
            cfg.to_json(),
        ]
        popen = subprocess.Popen(
            argv, env=None if env is None else dict(env), stdin=subprocess.DEVNULL, stderr=stderr
        )
        try:
            sock = cls._connect(popen, path, start_timeout)
        except BaseException:
            cls._terminate(popen, 0.1)
            raise
        logger.info("rank monitor for local rank %d started (pid %d)", local_rank, popen.pid)
        return cls(popen, sock, path, local_rank, cfg)

    @staticmethod
    def _connect(popen: subprocess.Popen[bytes], path: Path, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        hello = {"role": "controller", "pid": os.getpid()}
        while True:
            code = popen.poll()
            if code is not None:
                raise MonitorUnavailableError(
                    f"the rank monitor exited with code {code} before listening on {path}; "
                    "its log (stderr) says why"
                )
            if path.exists():
                try:
                    sock, _ = connect(str(path), hello, max(0.5, deadline - time.monotonic()))
                    return sock
                except MonitorUnavailableError:
                    if time.monotonic() >= deadline:
                        raise
            if time.monotonic() >= deadline:
                raise MonitorUnavailableError(
                    f"the rank monitor (pid {popen.pid}) did not listen on {path} within "
                    f"{timeout} s"
                )
            time.sleep(_CONNECT_POLL_S)

    @property
    def pid(self) -> int:
        """The monitor process's pid."""
        return self._popen.pid

    def is_alive(self) -> bool:
        """True while the monitor process runs."""
        return self._popen.poll() is None

    def _queue_event(self, msg: dict[str, Any]) -> None:
        if msg["t"] == "event":
            self._events.append(MonitorEvent.from_message(msg))
        else:
            logger.warning("unexpected %r message from the rank monitor; ignored", msg["t"])

    def _request(self, msg: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._sock is None:
                raise MonitorUnavailableError("the rank monitor was stopped")
            return request(self._sock, msg, _REQUEST_TIMEOUT_S, self._queue_event)

    def worker_started(
        self, pid: int, rank: int | None = None, restart: int = 0, *, watch_startup: bool = True
    ) -> None:
        """Tell the monitor a worker was spawned; its startup timer runs from now.

        Args:
            pid: The worker's pid.
            rank: Its global rank, if known.
            restart: How many times the workers were restarted before.
            watch_startup: False to run the startup timer (``rank_startup_timeout``) only once
                :meth:`arm_startup` is called: a worker that never connects is then never
                killed for it (a plain torchrun script). The time still counts from now.

        Raises:
            MonitorUnavailableError: The monitor is gone.
        """
        self._request(
            {
                "t": "worker_started",
                "pid": pid,
                "rank": rank,
                "restart": restart,
                "watch_startup": watch_startup,
            }
        )

    def arm_startup(self) -> None:
        """Arm the startup timer of the current worker (started with ``watch_startup=False``).

        The timer counts from the worker's spawn, so a worker already past
        ``rank_startup_timeout`` that has not connected is treated as hung at once.

        Raises:
            MonitorUnavailableError: The monitor is gone.
        """
        self._request({"t": "arm_startup"})

    def worker_stopped(self) -> None:
        """Tell the monitor the worker is being stopped on purpose; disarms its timers.

        Raises:
            MonitorUnavailableError: The monitor is gone.
        """
        self._request({"t": "worker_stopped"})

    def watch_status(self) -> dict[str, Any]:
        """Return what the monitor sees of its worker now (a cold request, not the hot path).

        Returns:
            ``{"hb_age": seconds since the last heartbeat or None, "section": the innermost
            open section or None}``; empty while no worker is watched.

        Raises:
            MonitorUnavailableError: The monitor is gone.
        """
        watch: dict[str, Any] = self._request({"t": "watch_status"}).get("watch", {})
        return watch

    def request_stack_dump(self) -> None:
        """Ask the monitor for its worker's Python stacks, leaving the worker running.

        The answer arrives later as a ``stacks`` event (its ``stack_dump`` is None when the worker
        cannot dump); while the monitor is already handling a hang, that hang's event carries the
        dump instead.

        Raises:
            MonitorUnavailableError: The monitor is gone.
        """
        self._request({"t": "dump_stacks"})

    def poll_events(self, timeout: float = 0.0) -> list[MonitorEvent]:
        """Return the events received so far, waiting up to ``timeout`` for the first one.

        Args:
            timeout: Seconds to wait when no event is pending (0: do not wait).

        Returns:
            The events, oldest first (empty when none arrived).

        Raises:
            MonitorUnavailableError: The monitor is gone and no event is pending.
        """
        with self._lock:
            wait = timeout
            while self._sock is not None:
                try:
                    msg = recv_message(self._sock, 0.0 if self._events else wait)
                except ProtocolError as exc:
                    logger.warning("invalid message from the rank monitor: %s", exc)
                    continue
                except MonitorUnavailableError:
                    if self._events:
                        break
                    raise
                if msg is None:
                    break
                self._queue_event(msg)
                wait = 0.0
            events = list(self._events)
            self._events.clear()
            return events

    def stop(self, timeout: float = 5.0) -> int | None:
        """Shut the monitor down: ask, then SIGTERM, then SIGKILL; remove its socket.

        Args:
            timeout: Seconds to wait after asking before SIGTERM.

        Returns:
            The monitor's exit code (None if it could not be reaped).
        """
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(MonitorUnavailableError, ProtocolError):
                    request(self._sock, {"t": "shutdown"}, min(timeout, 2.0), self._queue_event)
                self._sock.close()
                self._sock = None
        code = self._terminate(self._popen, timeout)
        for path in (self.socket_path, stack_dump_path_for(self.socket_path, self.local_rank)):
            path.unlink(missing_ok=True)
        return code

    @staticmethod
    def _terminate(popen: subprocess.Popen[bytes], timeout: float) -> int | None:
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                if popen.poll() is not None:
                    break
                logger.warning("rank monitor (pid %d) still runs; sending %s", popen.pid, sig.name)
                popen.send_signal(sig)
            try:
                return popen.wait(timeout if sig is None else 2.0)
            except subprocess.TimeoutExpired:
                continue
        return popen.poll()

    def __enter__(self) -> MonitorProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
