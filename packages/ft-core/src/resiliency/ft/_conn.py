"""One accepted connection on the monitor side: non-blocking record I/O with an outbox."""

from __future__ import annotations

import errno
import logging
import select
import socket
import time
from collections import deque
from collections.abc import Iterator

from resiliency.ft.protocol import MAX_FRAME_BYTES
from resiliency.ft.socket_dir import PeerCredentials

logger = logging.getLogger(__name__)

#: Records read per readiness event before the loop checks its timers again.
_MAX_BATCH = 512
#: Frames kept for a peer that does not read; older ones are dropped beyond this.
_MAX_OUTBOX = 4096
_GONE_ERRNOS = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF})


class Oversized:
    """Marker for a record longer than :data:`MAX_FRAME_BYTES` (its excess was discarded)."""


OVERSIZED = Oversized()


class Conn:
    """An accepted SOCK_SEQPACKET connection.

    Args:
        sock: The accepted socket (made non-blocking here).
        creds: The peer's credentials.
    """

    def __init__(self, sock: socket.socket, creds: PeerCredentials) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.creds = creds
        self.role = "pending"
        self.generation = -1
        self.opened_at = time.monotonic()
        self.closed = False
        self.said_bye = False
        self.outbox: deque[bytes] = deque()
        self._buf = bytearray(MAX_FRAME_BYTES)
        self._dropped_outbox = 0

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self.sock.fileno()

    def _peer_hung_up(self) -> bool:
        # A zero-length read is either an empty record or end of stream; poll tells them apart.
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLRDHUP)
        return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in poller.poll(0))

    def read_frames(self) -> Iterator[bytes | Oversized | None]:
        """Yield the records that are ready: bytes, :data:`OVERSIZED`, or None at end of stream."""
        for _ in range(_MAX_BATCH):
            try:
                nbytes, _, flags, _ = self.sock.recvmsg_into([self._buf])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in _GONE_ERRNOS:
                    logger.warning("reading from pid %d failed: %s", self.creds.pid, exc)
                yield None
                return
            if flags & socket.MSG_TRUNC:
                yield OVERSIZED
            elif nbytes == 0 and self._peer_hung_up():
                yield None
                return
            else:
                yield bytes(self._buf[:nbytes])

    def send(self, frame: bytes) -> bool:
        """Send a record now or queue it; return False when the peer is gone."""
        if self.closed:
            return False
        if self.outbox:
            self._queue(frame)
            return self.flush()
        try:
            self.sock.send(frame, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self._queue(frame)
        except OSError as exc:
            logger.debug("send to pid %d failed: %s", self.creds.pid, exc)
            return False
        return True

    def _queue(self, frame: bytes) -> None:
        if len(self.outbox) >= _MAX_OUTBOX:
            self.outbox.popleft()
            self._dropped_outbox += 1
            if self._dropped_outbox == 1:
                logger.warning(
                    "pid %d does not read its monitor socket; dropping the oldest queued messages",
                    self.creds.pid,
                )
        self.outbox.append(frame)

    def flush(self) -> bool:
        """Send queued records while the socket accepts them; return False when the peer is gone."""
        while self.outbox:
            try:
                self.sock.send(self.outbox[0], socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                logger.debug("send to pid %d failed: %s", self.creds.pid, exc)
                return False
            self.outbox.popleft()
        return True

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if not self.closed:
            self.closed = True
            self.sock.close()
