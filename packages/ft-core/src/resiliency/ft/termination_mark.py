"""A one-byte termination mark: its writer sets it just before it terminates its readers.

The readers (ranks) map the byte read-only, so a SIGTERM handler can tell, without any I/O,
whether the signal came from the process that owns the mark (a rank monitor ending a hang,
``ft-launcher`` stopping its workers) or from outside (a scheduler's preemption). The file is
created anew, never truncated in place: a reader that mapped an earlier file keeps it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["TerminationMark"]

logger = logging.getLogger(__name__)


class TerminationMark:
    """The writer's side of a one-byte termination mark.

    Args:
        path: The mark's file (e.g. ``termination_mark_path_for``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._set = False

    def create(self) -> None:
        """Write the mark as 0, atomically: a new file, never a truncated one.

        A rank that mapped an earlier monitor's mark keeps that file; truncating it in place
        would make the rank's next read of the mapping a SIGBUS.

        Raises:
            OSError: The file cannot be written.
        """
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0")
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._set = False

    def set(self, terminating: bool) -> None:
        """Write 1 (the writer is about to terminate the readers) or 0; log and go on on failure."""
        if terminating == self._set:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, b"\1" if terminating else b"\0", 0)
            finally:
                os.close(fd)
        except OSError as exc:
            # The reader then takes the termination for a preemption: it saves before it dies.
            logger.error("cannot write the termination mark %s: %s", self.path, exc)
            return
        self._set = terminating

    def remove(self) -> None:
        """Delete the file (a rank that mapped it keeps its mapping)."""
        self.path.unlink(missing_ok=True)
