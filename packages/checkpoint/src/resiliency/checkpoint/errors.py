"""Exceptions raised by :mod:`resiliency.checkpoint`; all derive from :class:`CheckpointError`."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CheckpointConfigError",
    "CheckpointCorruptError",
    "CheckpointDirNotWritableError",
    "CheckpointError",
    "NoCheckpointError",
    "SaveFailedError",
    "WriterFailedError",
]


class CheckpointError(Exception):
    """Base class of every error this package raises."""


class CheckpointConfigError(CheckpointError, ValueError):
    """The manager's configuration cannot work on this machine; a restart fails the same way.

    Raised when the manager is built. Uncaught, it ends the rank with exit code 78, and
    ft-launcher stops the job and exits 2 (see :mod:`resiliency.checkpoint.config_error_exit`).
    """


class CheckpointDirNotWritableError(CheckpointConfigError):
    """This rank cannot create, write or sync a file in the checkpoint directory.

    Attributes:
        path: the directory.
        errno: the operating system's error number (e.g. 30, ``EROFS``), or None.
    """

    def __init__(self, message: str, *, path: Path, errno: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class SaveFailedError(CheckpointError, RuntimeError):
    """A save failed on at least one rank (disk full, permission, ...); raised on every rank.

    The previous committed step is untouched and the manager stays usable.
    """


class WriterFailedError(SaveFailedError):
    """A rank's writer process died or hung during a save; raised on every rank.

    The dead (or killed, when it hung) writer is respawned for the next save.
    """


class CheckpointCorruptError(CheckpointError):
    """A committed step failed verification (missing manifest, wrong size or checksum)."""


class NoCheckpointError(CheckpointError, LookupError):
    """The requested step does not exist under the checkpoint root."""
