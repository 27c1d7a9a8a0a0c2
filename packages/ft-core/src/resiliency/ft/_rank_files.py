"""The files a monitor keeps beside its socket for its rank: the stack dump, the termination mark.

The termination mark is one byte the rank maps read-only: the monitor sets it to 1 just before it
sends the termination signal for a hang and back to 0 once that rank is gone, so a handler in the
rank (an emergency checkpoint's) can tell the monitor's SIGTERM from a scheduler's preemption
without any I/O inside the handler.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from resiliency.ft.socket_dir import stack_dump_path_for, termination_mark_path_for

logger = logging.getLogger(__name__)


class TerminationMark:
    """The monitor's side of the one-byte termination mark.

    Args:
        path: The mark's file (``termination_mark_path_for``).
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
        """Write 1 (the monitor is about to terminate its rank) or 0; log and go on on failure."""
        if terminating == self._set:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, b"\1" if terminating else b"\0", 0)
            finally:
                os.close(fd)
        except OSError as exc:
            # The rank then reads the termination as a preemption: it saves before it dies.
            logger.error("cannot write the termination mark %s: %s", self.path, exc)
            return
        self._set = terminating

    def remove(self) -> None:
        """Delete the file (a rank that mapped it keeps its mapping)."""
        self.path.unlink(missing_ok=True)


class RankFiles:
    """The stack-dump file and the termination mark of one local rank.

    Args:
        socket_path: The monitor's socket path.
        local_rank: The local rank.
    """

    def __init__(self, socket_path: str | os.PathLike[str], local_rank: int) -> None:
        self.dump_path = stack_dump_path_for(socket_path, local_rank)
        self.mark = TerminationMark(termination_mark_path_for(socket_path, local_rank))

    def create(self) -> None:
        """Create the empty (0600) stack-dump file and the mark, 0.

        Raises:
            OSError: A file cannot be created.
        """
        os.close(os.open(self.dump_path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
        self.mark.create()

    def remove(self) -> None:
        """Delete both files."""
        self.dump_path.unlink(missing_ok=True)
        self.mark.remove()
