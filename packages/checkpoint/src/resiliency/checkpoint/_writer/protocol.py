"""Frames between a rank and its writer process: length-prefixed JSON over a Unix socketpair.

Nothing is unpickled: a frame is a 4-byte big-endian length and a UTF-8 JSON object with a
``type``. The staging arena's file descriptor travels as SCM_RIGHTS ancillary data on one byte
that follows an ``arena`` frame. An oversized or malformed frame is a protocol error.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME = 64 << 20
_HEADER = struct.Struct(">I")


class ProtocolError(RuntimeError):
    """A malformed, oversized or unexpected frame."""


class PeerClosedError(ConnectionError):
    """The other end closed the socket (the process exited)."""


class ReplyTimeoutError(TimeoutError):
    """No complete frame arrived before the deadline."""


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one frame."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    sock.sendall(_HEADER.pack(len(data)) + data)


def send_fd(sock: socket.socket, fd: int) -> None:
    """Send one file descriptor (after an ``arena`` frame)."""
    socket.send_fds(sock, [b"F"], [fd])


def recv_fd(sock: socket.socket) -> int:
    """Receive the file descriptor that follows an ``arena`` frame."""
    msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
    if msg != b"F" or len(fds) != 1:
        raise ProtocolError("expected one file descriptor after an arena frame")
    return fds[0]


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplyTimeoutError("deadline passed while waiting for the writer")
            ready, _, _ = select.select([sock], [], [], min(left, 1.0))
            if not ready:
                continue
        try:
            chunk = sock.recv(min(n, 1 << 20))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise PeerClosedError("the peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    """Receive one frame; raise ``ReplyTimeoutError`` at the (monotonic) deadline."""
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    try:
        message = json.loads(_recv_exact(sock, length, deadline))
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("frame is not an object with a type")
    return message
