"""Exceptions raised by :mod:`resiliency.checkpoint`; all derive from :class:`CheckpointError`."""

from __future__ import annotations

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "NoCheckpointError",
    "SaveFailedError",
    "WriterFailedError",
]


class CheckpointError(Exception):
    """Base class of every error this package raises."""


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
