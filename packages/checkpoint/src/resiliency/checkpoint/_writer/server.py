"""The serving part of a rank's writer process, imported once its parent-death signal is set.

It imports torch and DCP once, lowers its own priority, says ``ready``, then serves ``save``
requests one at a time over the socket whose descriptor it was given. Each save writes this
rank's share of a step with DCP's file-system writer from the shared staging arena, fsyncs the
files and answers with the write results and the files' sizes and CRC-32s. It returns on
``exit`` or when the rank closes the socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import traceback
from typing import Any

import torch

from resiliency.checkpoint._dcp import planning as _dcp
from resiliency.checkpoint._dcp import staging as _staging
from resiliency.checkpoint._writer import protocol as _protocol

logger = logging.getLogger("resiliency.checkpoint.writer")

#: The writer's nice increment: writing must not compete with training for the CPU.
WRITER_NICE_ENV = "RESILIENCY_CKPT_WRITER_NICE"
_DEFAULT_NICE = 10


def _serve(sock: socket.socket) -> None:
    torch.set_num_threads(1)
    # torch.save's zip records would carry a CRC-32 of their own, a second pass over every
    # byte (a quarter of a save's time); each file's CRC-32 is in the manifest already, and
    # torch.load reads records without one.
    torch.serialization.set_crc32_options(False)
    _protocol.send(
        sock, {"type": "ready", "pid": os.getpid(), "version": _protocol.PROTOCOL_VERSION}
    )
    arena: Any = None
    while True:
        try:
            message = _protocol.recv(sock)
        except _protocol.PeerClosedError:
            return
        kind = message["type"]
        if kind == "exit":
            return
        if kind == "arena":
            fd = _protocol.recv_fd(sock)
            if arena is not None:
                with contextlib.suppress(BufferError):  # a view still holds it: unmapped later
                    arena.close()
            arena = _staging.attach(fd, int(message["size"]))
            os.close(fd)
            continue
        if kind != "save":
            raise _protocol.ProtocolError(f"unexpected frame type {kind!r}")
        job = message.get("job")
        start = time.monotonic()
        try:
            if arena is None:
                raise _protocol.ProtocolError("save before any arena")
            reply = _dcp.write_request(message, arena)
        except Exception as exc:
            logger.debug("save failed: %s", traceback.format_exc())
            reply = {"type": "error", "job": job, "error": f"{type(exc).__name__}: {exc}"}
        reply["seconds"] = time.monotonic() - start
        _protocol.send(sock, reply)


def _lower_priority() -> None:
    """Raise the writer's nice value by ``$RESILIENCY_CKPT_WRITER_NICE`` (default 10)."""
    raw = os.environ.get(WRITER_NICE_ENV, str(_DEFAULT_NICE))
    try:
        increment = int(raw)
    except ValueError:
        logger.warning(
            "%s=%r is not an integer; the writer uses nice +%d", WRITER_NICE_ENV, raw, _DEFAULT_NICE
        )
        increment = _DEFAULT_NICE
    try:
        os.nice(increment)
    except OSError as exc:  # e.g. a negative increment without the privilege
        logger.warning("cannot change the writer's nice value by %d: %s", increment, exc)


def serve(fd: int) -> int:
    """Serve saves on the socket descriptor ``fd`` until ``exit`` or the rank's EOF.

    Args:
        fd: this process's end of the socketpair the rank made for it.

    Returns:
        The process's exit code (0: asked to exit, or the rank went away).
    """
    logging.basicConfig(level=logging.WARNING, format="[ckpt-writer %(process)d] %(message)s")
    _lower_priority()
    sock = socket.socket(fileno=fd)
    try:
        _serve(sock)
    except (BrokenPipeError, ConnectionError):
        return 0
    finally:
        sock.close()
    return 0
