"""Asynchronous, atomic, verified checkpoints of distributed PyTorch training.

Every checkpoint is a standard ``torch.distributed.checkpoint`` (DCP) checkpoint plus a
``manifest.json`` of file sizes and checksums. See docs/checkpoint.md for the design.
"""

from __future__ import annotations

from ._emergency import (
    EXIT_INFO_DIR_ENV,
    PREEMPTED_EXIT_CODE_ENV,
    TERM_TIMEOUT_ENV,
    EmergencyCheckpoint,
    EmergencyCheckpointError,
)
from .app_state import AppState
from .auto_every import advised_every
from .config_error_exit import CONFIG_ERROR_EXIT_CODE, config_error
from .errors import (
    CheckpointConfigError,
    CheckpointCorruptError,
    CheckpointDirNotWritableError,
    CheckpointError,
    NoCheckpointError,
    SaveFailedError,
    WriterFailedError,
)
from .manager import CheckpointManager, SaveHandle
from .tiers import LocalTier, PersistentTier

__all__ = [
    "CONFIG_ERROR_EXIT_CODE",
    "EXIT_INFO_DIR_ENV",
    "PREEMPTED_EXIT_CODE_ENV",
    "TERM_TIMEOUT_ENV",
    "AppState",
    "CheckpointConfigError",
    "CheckpointCorruptError",
    "CheckpointDirNotWritableError",
    "CheckpointError",
    "CheckpointManager",
    "EmergencyCheckpoint",
    "EmergencyCheckpointError",
    "LocalTier",
    "NoCheckpointError",
    "PersistentTier",
    "SaveFailedError",
    "SaveHandle",
    "WriterFailedError",
    "advised_every",
    "config_error",
]
