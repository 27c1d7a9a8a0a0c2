"""``monitor_and_restart``: a process that forks its own replacement each time it dies (NVRx's
``inprocess.auto_restart``).

Call it first thing in a training script. It returns in a forked child, which runs the rest of
the script; the original process stays behind as a bare supervisor that waits for the child.
A child that exits 0 ends the supervisor with status 0; one that fails (an exit status, a
signal: SIGKILL, a segfault, the OOM killer) is forked again after ``restart_delay`` seconds,
and the new child runs the script from the call on. Under in-process restart the new child
rejoins the job as a respawned rank would. Use it where no launcher respawns a dead process
for you (``ft-launcher --ft-inprocess-respawn`` does, for one rank alone and without a delay).

The supervisor writes its lines to stderr itself, not through ``logging``: it must speak
whatever the script's logging configuration is (it runs before it), and NVRx's users read
these exact lines.
"""

from __future__ import annotations

import errno
import os
import sys
import time

__all__ = ["monitor_and_restart"]


def monitor_and_restart(restart_delay: float = 5.0) -> None:
    """Return in a forked child; supervise it here, forking again while it fails.

    Args:
        restart_delay: seconds between a failed child's end and the next fork.

    The supervisor never returns: it exits 0 when a child exits 0, and 1 when it cannot fork
    or wait.
    """
    _say("Starting self-monitoring mode")
    while True:
        try:
            child = os.fork()
        except OSError as exc:
            _say(f"fork: {exc}")
            os._exit(1)
        if child == 0:
            return
        _say(f"Launched child {child}")
        status = _wait_for(child)
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            _say(f"Child {child} exited with status {code}")
            if code == 0:
                os._exit(0)
        elif os.WIFSIGNALED(status):
            _say(f"Child {child} exited with signal {os.WTERMSIG(status)}")
        else:
            _say(f"Child {child} exited abnormally ({status:x})")
        time.sleep(restart_delay)


def _wait_for(child: int) -> int:
    """The child's wait status; exits the supervisor if it cannot be waited for."""
    while True:
        try:
            return os.waitpid(child, 0)[1]
        except OSError as exc:
            if exc.errno == errno.EINTR:  # a signal to the supervisor: wait on
                continue
            _say(f"waitpid: {exc}")
            os._exit(1)


def _say(line: str) -> None:
    sys.stderr.write(f"{line}\n")
