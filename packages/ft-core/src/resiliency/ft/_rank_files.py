"""The files a monitor keeps beside its socket for its rank: the stack dump, the termination mark.

The monitor sets the rank's termination mark (``TerminationMark``) to 1 just before it sends the
termination signal for a hang and back to 0 once that rank is gone, so a handler in the rank (an
emergency checkpoint's) can tell the monitor's SIGTERM from a scheduler's preemption.
"""

from __future__ import annotations

import os

from resiliency.ft.socket_dir import stack_dump_path_for, termination_mark_path_for
from resiliency.ft.termination_mark import TerminationMark


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
