"""The checkpoint root must be writable: probe it when the manager is built, not at the first save.

A read-only or foreign-owned root otherwise lets construction succeed and fails every save, and
every restart, the same way. Each rank probes (ranks on different nodes can see different
mounts): it creates the root, then creates, writes, fsyncs and removes a probe file of its own.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from resiliency.checkpoint.config_error_exit import CONFIG_ERROR_EXIT_CODE, config_error
from resiliency.checkpoint.errors import CheckpointDirNotWritableError

__all__ = ["ensure_writable"]


def ensure_writable(path: Path, rank: int) -> None:
    """Create ``path`` if needed and check that this rank can write and sync a file in it.

    Args:
        path: the checkpoint directory.
        rank: this rank, for the error.

    Raises:
        CheckpointDirNotWritableError: it cannot be created or written (marked as a
            configuration error: uncaught, the process exits 78 and ft-launcher exits 2).
    """
    probe = path / f".write-probe.{socket.gethostname()}.{os.getpid()}"
    try:
        _probe(path, probe)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        where = exc.filename or probe
        raise config_error(
            CheckpointDirNotWritableError(
                f"rank {rank} on {socket.gethostname()}: the checkpoint directory {path} is not "
                f"writable ({reason}, errno {exc.errno}, at {where}); every save would fail. "
                "Give CheckpointManager a directory this job can write (or fix the mount or the "
                "permissions) and start the job again. A restart fails the same way: uncaught, "
                f"this error ends the rank with exit code {CONFIG_ERROR_EXIT_CODE}, and "
                "ft-launcher then stops the job and exits 2 (fix the configuration) instead of "
                "restarting.",
                path=path,
                errno=exc.errno,
            )
        ) from exc


def _probe(path: Path, probe: Path) -> None:
    """Create ``path``, then create, write, fsync and remove ``probe`` in it."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"\0")
        os.fsync(fd)  # a full or broken device can refuse only the sync
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
