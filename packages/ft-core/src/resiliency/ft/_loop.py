"""The monitor's socket machinery: listen, accept, read, validate, send; one selectors loop.

:class:`SocketLoop` knows nothing about ranks or timers. It turns records into validated messages
and hands them to :meth:`SocketLoop._dispatch`; the subclass
(:class:`resiliency.ft.server.RankMonitorServer`) decides what they mean. A frame that fails
validation is logged (rate-limited) and dropped; only a bad handshake closes a connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from pathlib import Path
from types import FrameType
from typing import Any

from resiliency.ft._bad_frames import BadFrameLog
from resiliency.ft._conn import OVERSIZED, Conn
from resiliency.ft._repeated_errors import RepeatedErrorLog
from resiliency.ft.errors import ConfigError, FaultToleranceError, ProtocolError
from resiliency.ft.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    HotFrameDecoder,
    decode_frame,
    encode_frame,
    version_mismatch_message,
)
from resiliency.ft.socket_dir import check_socket_path, ensure_private_dir, peer_credentials

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
_MAX_PENDING = 32
#: Requests that expect an answer; a failure is answered with an error frame.
_REQUESTS = frozenset({"stats", "set_timeouts", "wlc", "bye", "worker_started", "worker_stopped"})


class SocketLoop:
    """A SOCK_SEQPACKET server on one socket path, driven by :meth:`serve_forever`.

    Args:
        socket_path: Where to listen; its directory must be private (created 0700 if missing).

    Raises:
        ConfigError: The socket path is too long for a Unix socket.
    """

    def __init__(self, socket_path: str | os.PathLike[str]) -> None:
        self.socket_path = Path(check_socket_path(socket_path))
        self._conns: dict[int, Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._stop_reason: str | None = None
        self._bad = BadFrameLog()
        self._errors = RepeatedErrorLog(logger, "unexpected error in the monitor loop")
        self._hot = HotFrameDecoder()

    # -- hooks for the subclass ---------------------------------------------------------------

    def _dispatch(self, conn: Conn, msg: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _on_hot(self, conn: Conn, t: str, name: str | None, ts: float, now: float) -> None:
        """Handle a heartbeat or section frame from a rank (decoded on the fast path or not)."""
        raise NotImplementedError

    def _on_disconnect(self, conn: Conn) -> None:
        """Called when a connection closes (not at shutdown)."""

    def _tick(self, now: float) -> None:
        """Called after every wake-up."""

    def _next_wakeup(self, now: float) -> float:
        """Return when the loop must wake up at the latest."""
        return now + 1.0

    # -- lifecycle ----------------------------------------------------------------------------

    def bind(self) -> None:
        """Create the listening socket in the private directory.

        Raises:
            ConfigError: The directory is not private, or another monitor listens on the path.
            OSError: The socket cannot be created.
        """
        ensure_private_dir(self.socket_path.parent)
        if self.socket_path.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
                try:
                    probe.connect(str(self.socket_path))
                except OSError:
                    self.socket_path.unlink()  # the stale socket of a dead monitor
                else:
                    raise ConfigError(f"another rank monitor already listens on {self.socket_path}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        listener.listen(16)
        listener.setblocking(False)
        self._listener = listener
        self._sel.register(listener, selectors.EVENT_READ, "listen")
        logger.info(
            "listening on %s (pid %d, protocol v%d)",
            self.socket_path,
            os.getpid(),
            PROTOCOL_VERSION,
        )

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT stop the loop cleanly (main thread only)."""
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        self._wakeup = (reader, writer)
        self._sel.register(reader, selectors.EVENT_READ, "wakeup")
        # The wakeup fd makes select() return at once; the handler alone would wait for a timeout.
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            self.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)

    def request_stop(self, reason: str) -> None:
        """Ask the loop to exit after the current iteration."""
        if self._stop_reason is None:
            self._stop_reason = reason

    def serve_forever(self) -> int:
        """Run until :meth:`request_stop` is called.

        Returns:
            The process exit code (0).
        """
        if self._listener is None:
            self.bind()
        try:
            while self._stop_reason is None:
                try:
                    self._iterate()
                except Exception as exc:
                    # The loop must survive anything; a persistent failure is slowed, not spun.
                    self._errors.report(exc)
                    time.sleep(0.05)
            if self._bad.total:
                logger.warning("dropped %d malformed frames in total", self._bad.total)
            logger.info("exiting: %s", self._stop_reason)
        finally:
            self.close()
        return 0

    def close(self) -> None:
        """Close every connection and remove the socket."""
        for conn in list(self._conns.values()):
            self._drop(conn, notify=False)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        if self._wakeup is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)
            for sock in self._wakeup:
                sock.close()
            self._wakeup = None

    # -- the loop -----------------------------------------------------------------------------

    def _iterate(self) -> None:
        now = time.monotonic()
        wake = self._next_wakeup(now)
        for conn in self._conns.values():
            if conn.role == "pending":
                wake = min(wake, conn.opened_at + HANDSHAKE_TIMEOUT_S)
        for key, mask in self._sel.select(max(0.0, wake - now)):
            if key.data == "listen":
                self._accept()
            elif key.data == "wakeup":
                with contextlib.suppress(BlockingIOError):
                    key.fileobj.recv(4096)  # type: ignore[union-attr]
            elif isinstance(key.data, Conn):
                if mask & selectors.EVENT_WRITE:
                    self._flush(key.data)
                if mask & selectors.EVENT_READ:
                    self._read(key.data)
        now = time.monotonic()
        self._bad.maybe_summarize(now)
        for conn in list(self._conns.values()):
            if conn.role == "pending" and now - conn.opened_at > HANDSHAKE_TIMEOUT_S:
                logger.warning(
                    "pid %d sent no hello within %.0f s", conn.creds.pid, HANDSHAKE_TIMEOUT_S
                )
                self._drop(conn)
        self._tick(now)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn = Conn(sock, peer_credentials(sock))
            if sum(c.role == "pending" for c in self._conns.values()) >= _MAX_PENDING:
                logger.warning("too many unfinished handshakes; refusing pid %d", conn.creds.pid)
                conn.close()
                continue
            self._conns[conn.fileno()] = conn
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: Conn, *, notify: bool = True) -> None:
        if conn.closed:
            return
        self._conns.pop(conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.close()
        if notify:
            self._on_disconnect(conn)

    def _send(self, conn: Conn, msg: dict[str, Any]) -> None:
        """Send (or queue) one message; a peer that is gone is dropped.

        Raises:
            ProtocolError: The message is invalid or too big.
        """
        if not conn.send(encode_frame(msg)):
            self._drop(conn)
        elif conn.outbox:
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: Conn) -> None:
        if not conn.flush():
            self._drop(conn)
        elif not conn.outbox:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _refuse(self, conn: Conn, msg: str, code: str = "refused") -> None:
        logger.warning("refused a connection from pid %d: %s", conn.creds.pid, msg)
        conn.send(encode_frame({"t": "error", "code": code, "msg": msg}))
        self._drop(conn, notify=False)

    def _read(self, conn: Conn) -> None:
        for data in conn.read_frames():
            if data is None:
                self._drop(conn)
                return
            now = time.monotonic()
            if data is OVERSIZED:
                self._bad.report(now, conn.creds.pid, f"over {MAX_FRAME_BYTES} bytes", None)
                continue
            assert isinstance(data, bytes)
            hot = self._hot.decode(data) if conn.role == "rank" else None
            if hot is not None:
                try:
                    self._on_hot(conn, *hot, now)
                except FaultToleranceError as exc:
                    self._bad.report(now, conn.creds.pid, str(exc), data)
                continue
            try:
                msg = decode_frame(data)
            except ProtocolError as exc:
                self._bad.report(now, conn.creds.pid, str(exc), data)
                if conn.role == "pending":
                    mismatch = version_mismatch_message(data)
                    if mismatch is not None:
                        self._refuse(conn, mismatch, code="version")
                    else:
                        self._refuse(conn, f"invalid hello: {exc}")
                    return
                continue
            if conn.role == "rank":
                self._hot.learn(data, msg)
            try:
                self._dispatch(conn, msg, now)
            except FaultToleranceError as exc:
                self._bad.report(now, conn.creds.pid, str(exc), data)
                if msg["t"] in _REQUESTS and not conn.closed:
                    self._send(conn, {"t": "error", "msg": str(exc)})
            if conn.closed:
                return
