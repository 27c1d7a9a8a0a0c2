"""Length-prefixed JSON frames between ft-launcher and its fork server (never pickle)."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 << 20


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one length-prefixed JSON frame."""
    data = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """Receive one frame; None when the peer closed the socket.

    Raises:
        ValueError: an oversized or malformed frame.
    """
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    data = _recv_exact(sock, size)
    if data is None:
        return None
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a frame is not a JSON object")
    return message
