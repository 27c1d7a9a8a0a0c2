"""Auto-resume support: the finished flag that tells a job loop to stop launching new jobs."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from resiliency.checkpoint import CONFIG_ERROR_EXIT_CODE, config_error
from resiliency.ptl._compat import early_stopping_types
from resiliency.ptl.errors import AutoResumeConfigError

__all__ = ["FINISHED_FLAG_ENV", "finished_flag_path", "training_is_complete", "write_finished_flag"]

FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"

_log = logging.getLogger(__name__)


def finished_flag_path() -> Path:
    """Return the flag file named by ``FAULT_TOL_FINISHED_FLAG_FILE``.

    Returns:
        The path (it need not exist yet).

    Raises:
        AutoResumeConfigError: The variable is not set or empty (a configuration error: uncaught,
            the rank exits 78 and ft-launcher exits 2, see ``resiliency.checkpoint.config_error``).
    """
    value = os.environ.get(FINISHED_FLAG_ENV, "")
    if not value:
        # A restart fails the same way: marked, it ends the rank with the configuration-error
        # code, so ft-launcher stops instead of restarting and exits 2 (fix the configuration).
        raise config_error(
            AutoResumeConfigError(
                f"autoresume=True needs the environment variable {FINISHED_FLAG_ENV}: the path of "
                "the file to create when training is complete (the auto-resume loop stops when it "
                f"exists). Set it (e.g. `export {FINISHED_FLAG_ENV}=$PWD/finished.flag`, or "
                "ft-launcher's --finished-flag-file) or pass autoresume=False. Uncaught, this "
                f"error ends the rank with exit code {CONFIG_ERROR_EXIT_CODE}, and ft-launcher "
                "exits 2 without restarting."
            )
        )
    return Path(value)


def training_is_complete(trainer: Any) -> bool:
    """Tell whether a fit ended because training is done, not because it was interrupted.

    Done means ``max_steps`` or ``max_epochs`` was reached, or an ``EarlyStopping`` callback
    stopped it (a resumed job would only stop again). A stop requested for another reason (a
    straggler, a signal, ``max_time``) is not completion.

    Args:
        trainer: The Lightning ``Trainer`` at the end of ``fit``.

    Returns:
        True when no further job is needed.
    """
    max_steps = trainer.max_steps
    if max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps:
        return True
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs >= 0 and trainer.current_epoch >= max_epochs:
        return True
    return any(
        isinstance(cb, early_stopping_types()) and cb.stopped_epoch > 0 for cb in trainer.callbacks
    )


def write_finished_flag(path: Path, reason: str) -> None:
    """Create the finished flag (idempotent), with the reason inside for whoever reads it.

    Args:
        path: The flag file.
        reason: One line saying why the job is finished.

    Raises:
        OSError: The file cannot be created.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n", encoding="utf-8")
    _log.info("finished flag written to %s: %s", path, reason)
