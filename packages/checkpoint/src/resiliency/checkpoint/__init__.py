"""Asynchronous, atomic, verified checkpoints of distributed PyTorch training.

Every checkpoint is a standard ``torch.distributed.checkpoint`` (DCP) checkpoint plus a
``manifest.json`` of file sizes and checksums. See docs/checkpoint.md for the design.
"""

from __future__ import annotations

from resiliency.checkpoint._emergency.checkpoint import (
    EXIT_INFO_DIR_ENV,
    PREEMPTED_EXIT_CODE_ENV,
    TERM_TIMEOUT_ENV,
    EmergencyCheckpoint,
    EmergencyCheckpointError,
)
from resiliency.checkpoint.app_state import AppState
from resiliency.checkpoint.auto_every import advised_every
from resiliency.checkpoint.config_error_exit import CONFIG_ERROR_EXIT_CODE, config_error
from resiliency.checkpoint.errors import (
    CheckpointConfigError,
    CheckpointCorruptError,
    CheckpointDirNotWritableError,
    CheckpointError,
    NoCheckpointError,
    SaveFailedError,
    WriterFailedError,
)
from resiliency.checkpoint.manager import CheckpointManager, SaveHandle
from resiliency.checkpoint.tiers import LocalTier, PersistentTier

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
