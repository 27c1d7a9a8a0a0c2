"""Exit codes of ``ft-launcher``: the contract with the scheduler and with auto-resume scripts.

The launcher never passes a worker's own exit code through (like ``torchrun``, a failed worker
group makes the launcher exit 1), so the codes below cannot be mistaken for a worker's code.
Where NVIDIA's ``ft_launcher`` or ``torchrun`` has the same situation, the code is theirs: 0 on
success, 1 on any failure, including a signal to the launcher (SIGTERM, SIGINT, ...) after which
some worker did not exit 0 (e.g. one that ignored it and was killed after ``--term-timeout``).
Codes 2 and up are this toolkit's own.

==  ====================  ===================================================================
0   SUCCESS               every worker exited 0, or a forwarded SIGTERM/SIGINT ended them cleanly
1   FAILURE               restarts ran out, the rendezvous failed, the launcher hit an error, or
                          a signal to the launcher ended workers that did not all exit 0
2   USAGE                 a bad flag or configuration file (no worker was started), or a
                          worker exited 78: a configuration error a restart cannot fix, e.g.
                          a checkpoint directory it cannot write (see ``config_error``);
                          fix the configuration, do not requeue as is
3   SHUTDOWN_WORKLOAD     a rank asked for ``ShutdownWorkload``: do NOT requeue the job
4   NODE_EXCLUDED         this node left the job (``ExcludeThisNode`` or a failed health
                          check): requeue without this node
5   PREEMPTED             the workers saved an emergency checkpoint and exited 75 ("preempted,
                          saved step N"): requeue the job, it resumes from that step
6   DIAGNOSED_STOP        the failure diagnosis stopped the job before --max-restarts ran out:
                          the same failure (class, culprit ranks, cause) in
                          max_no_progress_cycles consecutive attempts, or a restart storm; the
                          last line names the repeated cause: fix it, do not requeue as is
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
    PREEMPTED = 5
    DIAGNOSED_STOP = 6
