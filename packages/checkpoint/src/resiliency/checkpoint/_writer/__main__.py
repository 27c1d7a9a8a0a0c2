"""The persistent writer process of one rank: ``python -m resiliency.checkpoint._writer FD``.

A tiny module entry (never the user's main script): it imports torch and DCP once, lowers its
own priority, says ``ready``, then serves ``save`` requests one at a time over the socket whose
descriptor it was given. Each save writes this rank's share of a step with DCP's file-system
writer from the shared staging arena, fsyncs the files and answers with the write results and
the files' sizes and CRC-32s. It exits on ``exit`` or when the rank closes the socket, and
ignores the termination signals sent to the rank's process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

logger = logging.getLogger("resiliency.checkpoint.writer")

_PR_SET_PDEATHSIG = 1
#: The writer's nice increment: writing must not compete with training for the CPU.
WRITER_NICE_ENV = "RESILIENCY_CKPT_WRITER_NICE"
_DEFAULT_NICE = 10


def _serve(sock: socket.socket) -> None:
    import torch  # noqa: PLC0415 -- warm-up happens here, before "ready"

    from resiliency.checkpoint._dcp import planning as _dcp  # noqa: PLC0415
    from resiliency.checkpoint._dcp import staging as _staging  # noqa: PLC0415
    from resiliency.checkpoint._writer import protocol as _protocol  # noqa: PLC0415

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


def _die_with_parent() -> None:
    """Ask Linux for SIGKILL when the rank dies (the writer lives in a session of its own)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError) as exc:  # not Linux: the socket's EOF still ends it
        logger.debug("no parent-death signal: %s", exc)
    if os.getppid() != parent:  # the rank died before the request took effect
        os._exit(0)


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


def main(argv: list[str] | None = None) -> int:
    """Serve saves on the socket descriptor given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    fd = int(args[0])
    # The writer shares the rank's process group, so a launcher's or scheduler's SIGTERM (a
    # restart, a preemption) reaches it too. It must outlive that signal to finish the save the
    # rank is waiting for (an emergency save above all); it ends when the rank closes the socket.
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    _die_with_parent()
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


if __name__ == "__main__":
    exit_code = main()
    # Every file it wrote is fsynced and its socket is closed. The interpreter's teardown of
    # torch (about a second, more on a busy node) is skipped: the rank's close(), and with it a
    # preempted job's exit, would wait for it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
