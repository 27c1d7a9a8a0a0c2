"""Exit codes of ``ft-launcher``: the contract with the scheduler and with auto-resume scripts.

The launcher never passes a worker's own exit code through (like ``torchrun``, a failed worker
group makes the launcher exit 1), so the codes below cannot be mistaken for a worker's code.

==  ====================  ===================================================================
0   SUCCESS               every worker exited 0, or a forwarded SIGTERM/SIGINT ended them cleanly
1   FAILURE               restarts ran out, the rendezvous failed, or the launcher hit an error
2   USAGE                 a bad flag or configuration file; no worker was started
3   SHUTDOWN_WORKLOAD     a rank asked for ``ShutdownWorkload``: do NOT requeue the job
4   NODE_EXCLUDED         this node left the job (``ExcludeThisNode`` or a failed health
                          check): requeue without this node
128+N                     a forwarded signal N ended the workers, and some did not exit 0
==  ====================  ===================================================================

The same verdict is also written as JSON to ``--exit-status-file`` when given, because an exit
code alone can get lost between the launcher and the scheduler.
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """Process exit codes of ``ft-launcher`` (see the module docstring)."""

    SUCCESS = 0
    FAILURE = 1
    USAGE = 2
    SHUTDOWN_WORKLOAD = 3
    NODE_EXCLUDED = 4

    @staticmethod
    def for_signal(signum: int) -> int:
        """Return the conventional exit code for workers ended by signal ``signum``.

        Args:
            signum: the signal number that was forwarded to the workers.

        Returns:
            ``128 + signum``.
        """
        return 128 + int(signum)
