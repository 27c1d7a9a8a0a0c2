"""``monitor_and_restart``: a process that forks its own replacement each time it dies (NVRx's
``inprocess.auto_restart``).

Call it first thing in a training script. It returns in a forked child, which runs the rest of
the script; the original process stays behind as a bare supervisor that waits for the child.
A child that exits 0 ends the supervisor with status 0; one that fails (an exit status, a
signal: SIGKILL, a segfault, the OOM killer) is forked again after ``restart_delay`` seconds,
and the new child runs the script from the call on. Every child after the first replaces a
dead one: its Wrapper joins the running job at its restart barrier, takes its predecessor's
rank and is healed like a rank ``ft-launcher --ft-inprocess-respawn`` respawned, while the
other ranks keep their processes. So under plain ``torchrun`` a SIGKILLed rank no longer ends
the job: torchrun sees only the supervisor, which stays alive. The replacement must reach the
job within the Wrapper's ``heartbeat_timeout`` (``restart_delay`` plus its start), or the others
go on without it. Rank 0 is the exception with the default store, which rank 0's process hosts:
its death takes the store with it (``ft-launcher --ft-inprocess-respawn`` hosts the store in
the launcher, and respawns without a delay).

A replacement the job no longer takes (its rank was declared gone, the store is unreachable,
the job has ended) records why before it fails; the supervisor then stops and exits with the
child's status, where NVRx's forks it again forever (a torchrun worker that never ends).

The supervisor writes its lines to stderr itself, not through ``logging``: it must speak
whatever the script's logging configuration is (it runs before it), and NVRx's users read
these exact lines.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tempfile
import time
from pathlib import Path

from resiliency.inprocess._launcher_contract import REFUSED_SUFFIX, REJOIN_FILE_ENV

__all__ = ["monitor_and_restart"]


def monitor_and_restart(restart_delay: float = 5.0) -> None:
    """Return in a forked child; supervise it here, forking again while it fails.

    Args:
        restart_delay: seconds between a failed child's end and the next fork.

    The supervisor never returns: it exits 0 when a child exits 0, with the child's status
    (1 for a signal) when a replacement could not rejoin the job, and 1 when it cannot fork or
    wait.
    """
    _say("Starting self-monitoring mode")
    joined = Path(tempfile.gettempdir()) / f"resiliency-auto-restart-{os.getpid()}.joined"
    refused = Path(str(joined) + REFUSED_SUFFIX)
    while True:
        try:
            child = os.fork()
        except OSError as exc:
            _say(f"fork: {exc}")
            _exit(1, joined)
        if child == 0:
            return
        _say(f"Launched child {child}")
        status = _wait_for(child, joined)
        code = 1
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            _say(f"Child {child} exited with status {code}")
            if code == 0:
                _exit(0, joined)
        elif os.WIFSIGNALED(status):
            _say(f"Child {child} exited with signal {os.WTERMSIG(status)}")
        else:
            _say(f"Child {child} exited abnormally ({status:x})")
        if refused.exists():
            _say(f"Child {child} could not rejoin the job ({_read(refused)}); not forking again")
            _exit(code or 1, joined)
        time.sleep(restart_delay)
        # The next child replaces a dead one: a Wrapper in it joins the running job (and writes
        # its pid to the file once it has joined, as for ft-launcher).
        os.environ[REJOIN_FILE_ENV] = str(joined)


def _wait_for(child: int, joined: Path) -> int:
    """The child's wait status; exits the supervisor if it cannot be waited for."""
    while True:
        try:
            return os.waitpid(child, 0)[1]
        except OSError as exc:
            if exc.errno == errno.EINTR:  # a signal to the supervisor: wait on
                continue
            _say(f"waitpid: {exc}")
            _exit(1, joined)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        return f"its reason could not be read: {exc}"


def _exit(code: int, joined: Path) -> None:
    """End the supervisor, removing the files a replacement wrote (joined, or refused)."""
    for path in (joined, Path(str(joined) + REFUSED_SUFFIX)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    os._exit(code)


def _say(line: str) -> None:
    sys.stderr.write(f"{line}\n")
