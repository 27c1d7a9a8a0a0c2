"""Wake the agent's monitoring loop when a worker exits, instead of at its next interval.

torch's agent looks at its workers every ``--monitor-interval`` (torchrun's default 0.1 s; the
goodput benchmark runs 0.5 s), so a crash is seen on average half an interval late, and every
recovery (a group restart, a rank respawned alone) starts that much later. Here the loop sleeps
on a pidfd per worker (Linux 5.3+): it wakes as soon as one exits, whichever process is its
parent (workers forked by the ``--ft-preimport`` server are not the agent's children, so
SIGCHLD would not reach it), and otherwise after the interval as before. Each exit wakes the
loop once per cycle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import time
from pathlib import Path
from typing import Protocol

from resiliency.launcher._cycle import Cycle

__all__ = ["sleep_until_an_exit"]

logger = logging.getLogger(__name__)


#: How often to look whether another parent reaped an exited worker (a few ms at most).
_REAP_POLL_S = 0.002


class ExitReports(Protocol):
    """Where the exit codes of workers forked by the pre-imported server arrive (ForkServer)."""

    def exit_code(self, pid: int) -> int | None:
        """The worker's exit code once reported, else None."""


def _exit_visible(pid: int, reports: ExitReports | None) -> bool:
    """Whether the agent can see ``pid``'s exit: a zombie this process must reap itself, or a
    process another parent reaped whose exit code has reached this process (``reports``; None:
    nothing to wait for once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return reports is None or reports.exit_code(pid) is not None
    # "pid (comm) state ppid ...": comm may hold spaces, so split after its last ')'
    return int(stat[stat.rindex(")") + 2 :].split()[1]) == os.getpid()


def sleep_until_an_exit(cycle: Cycle, timeout: float, reports: ExitReports | None = None) -> None:
    """Sleep ``timeout`` seconds, or less: until a worker of ``cycle`` not yet seen exits.

    Args:
        cycle: the workers to watch.
        timeout: the longest sleep (the monitoring interval).
        reports: the pre-imported server's exit reports, for the workers it forked (the agent
            reads their exit codes from it); None without the server.
    """
    fds: dict[int, int] = {}
    try:
        for pid in sorted(set(cycle.pids.values()) - cycle.exits_seen):
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                cycle.exits_seen.add(pid)  # gone and reaped already: look at once
                return
            except OSError as exc:  # no pidfd here (an old kernel): the plain interval
                logger.debug("pidfd_open(%d) failed (%s); sleeping the interval", pid, exc)
                time.sleep(timeout)
                return
        if not fds:
            time.sleep(timeout)
            return
        started = time.monotonic()
        ready, _, _ = select.select(list(fds), [], [], timeout)
        exited = [fds[fd] for fd in ready]
        cycle.exits_seen.update(exited)
        # A worker forked by the pre-imported server is that server's child: the agent learns
        # its exit code only once the server has reaped it and its report has arrived. Looking
        # before would see it still running and then sleep a whole interval.
        deadline = started + timeout
        while (
            not all(_exit_visible(pid, reports) for pid in exited) and time.monotonic() < deadline
        ):
            time.sleep(_REAP_POLL_S)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
