"""The connecting side of the protocol (rank client and controller): handshake and requests.

These calls block with a timeout; they serve the cold path only. The rank client's hot path sends
pre-encoded frames directly with ``MSG_DONTWAIT`` and never comes here.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from resiliency.ft.errors import (
    MonitorRefusedError,
    MonitorUnavailableError,
    ProtocolError,
    ProtocolVersionError,
)
from resiliency.ft.protocol import MAX_FRAME_BYTES, PROTOCOL_VERSION, decode_frame, encode_frame

GONE_ERRNOS = frozenset(
    {errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED, errno.ENOENT, errno.EBADF}
)


def _wait(sock: socket.socket, events: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(max(0.0, timeout) * 1000.0))


def send_message(sock: socket.socket, msg: dict[str, Any], timeout: float) -> None:
    """Encode and send one message, waiting up to ``timeout`` for room in the socket buffer.

    Raises:
        MonitorUnavailableError: The monitor is gone or does not read within the timeout.
        ProtocolError: The message is invalid.
    """
    send_message_raw(sock, encode_frame(msg), timeout)


def send_message_raw(sock: socket.socket, frame: bytes, timeout: float) -> None:
    """Send one encoded frame, waiting up to ``timeout`` for room in the socket buffer.

    Raises:
        MonitorUnavailableError: The monitor is gone or does not read within the timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.send(frame, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            return
        except (BlockingIOError, InterruptedError):
            if not _wait(sock, select.POLLOUT, deadline - time.monotonic()):
                raise MonitorUnavailableError(
                    f"the rank monitor did not read its socket for {timeout} s"
                ) from None
        except OSError as exc:
            raise MonitorUnavailableError(f"the rank monitor is gone ({exc})") from exc


def recv_message(sock: socket.socket, timeout: float) -> dict[str, Any] | None:
    """Receive one message.

    Returns:
        The validated message, or None when nothing arrived within ``timeout``.

    Raises:
        MonitorUnavailableError: The monitor closed the connection.
        ProtocolError: The monitor sent an invalid frame.
    """
    if timeout > 0 and not _wait(sock, select.POLLIN, timeout):
        return None
    try:
        data = sock.recv(MAX_FRAME_BYTES + 1, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        raise MonitorUnavailableError(f"the rank monitor is gone ({exc})") from exc
    if not data:
        raise MonitorUnavailableError("the rank monitor closed the connection")
    return decode_frame(data)


def request(
    sock: socket.socket,
    msg: dict[str, Any],
    timeout: float,
    on_other: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Send a request and wait for its ``ok`` reply (other messages go to ``on_other``).

    Returns:
        The ``ok`` reply.

    Raises:
        MonitorUnavailableError: The monitor is gone or does not answer within ``timeout``.
        ProtocolError: The monitor answered with an error (its message is the exception's).
    """
    deadline = time.monotonic() + timeout
    send_message(sock, msg, timeout)
    while True:
        left = deadline - time.monotonic()
        reply = recv_message(sock, left) if left > 0 else None
        if reply is None:
            raise MonitorUnavailableError(
                f"the rank monitor did not answer a {msg['t']!r} request within {timeout} s"
            )
        if reply["t"] == "ok":
            return reply
        if reply["t"] == "error":
            raise ProtocolError(f"the rank monitor refused {msg['t']!r}: {reply['msg']}")
        if on_other is not None:
            on_other(reply)


def connect(
    path: str, hello: dict[str, Any], timeout: float
) -> tuple[socket.socket, dict[str, Any]]:
    """Connect to a monitor and complete the handshake.

    Args:
        path: The monitor's socket path.
        hello: The hello message (without ``"t"`` and ``"v"``).
        timeout: Seconds allowed for connecting and the handshake.

    Returns:
        The connected (blocking) socket and the monitor's welcome message.

    Raises:
        MonitorUnavailableError: Nothing listens on ``path``, or no answer in time.
        MonitorRefusedError: The monitor refused this process.
        ProtocolVersionError: The monitor speaks another protocol version.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            raise MonitorUnavailableError(
                f"cannot connect to the rank monitor at {path}: {exc.strerror or exc}"
            ) from exc
        sock.settimeout(None)
        send_message(sock, {"t": "hello", "v": PROTOCOL_VERSION, **hello}, timeout)
        try:
            reply = recv_message(sock, timeout)
        except MonitorUnavailableError:
            reply = None
        if reply is None:
            raise MonitorUnavailableError(f"the rank monitor at {path} did not answer the hello")
        if reply["t"] == "error":
            if reply.get("code") == "version":
                raise ProtocolVersionError(reply["msg"])
            raise MonitorRefusedError(f"the rank monitor at {path} refused: {reply['msg']}")
        if reply["t"] != "welcome":
            raise ProtocolError(f"expected a welcome from the rank monitor, got {reply['t']!r}")
        if reply["v"] != PROTOCOL_VERSION:
            raise ProtocolVersionError(
                f"protocol version mismatch: client speaks v{PROTOCOL_VERSION}, monitor speaks "
                f"v{reply['v']}; install the same resiliency-ft-core on both sides"
            )
    except BaseException:
        sock.close()
        raise
    return sock, reply
