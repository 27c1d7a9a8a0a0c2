"""The persistent writer process of one rank: ``python .../_writer/__main__.py FD PARENT_PID``.

The rank runs this file by its path, not with ``-m``: ``-m`` would import the
``resiliency.checkpoint`` package (torch, seconds on a busy node) before the first line here
runs. So this entry imports only the standard library, asks Linux for SIGKILL when the rank
dies, checks that the rank did not die before that request took effect, and only then imports
the serving part (``server``). A rank SIGKILLed while its writer still imports torch takes the
writer with it at once, instead of leaving an orphan that lives until its imports end.

``FD`` is the writer's end of the rank's socketpair; ``PARENT_PID`` is the rank's pid, the
parent this process must still have once its parent-death signal is set. The writer ignores
the termination signals sent to the rank's process group and ends with the rank: at its
socket's EOF, or by the parent-death signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
#: Exit code when the rank was gone before the parent-death signal was set (nothing to serve).
PARENT_GONE_EXIT = 0


def _die_with_parent(parent: int) -> None:
    """Ask Linux for SIGKILL when ``parent`` dies; exit now if it already has.

    The request only covers a parent alive when it is made: a rank that died between this
    process's fork and the request left it reparented (to init or a subreaper), which
    ``getppid()`` shows once the request is in place.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError) as exc:  # not Linux: the socket's EOF still ends it
        sys.stderr.write(f"[ckpt-writer {os.getpid()}] no parent-death signal: {exc}\n")
    if os.getppid() != parent:
        os._exit(PARENT_GONE_EXIT)


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(arg.isdigit() for arg in argv):
        sys.stderr.write(f"usage: {sys.argv[0]} FD PARENT_PID (got {argv!r})\n")
        return 2
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    # The writer shares the rank's process group, so a launcher's or scheduler's SIGTERM (a
    # restart, a preemption) reaches it too. It must outlive that signal to finish the save the
    # rank is waiting for (an emergency save above all); it ends when the rank closes the socket.
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    # Run by its path, this file's folder leads sys.path: its sibling modules (client,
    # protocol, server) must not shadow top-level modules of the same names.
    # (Python resolves a symlinked script's path for sys.path[0]: compare resolved paths.)
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    from resiliency.checkpoint._writer import server  # noqa: PLC0415 -- only after the signal

    return server.serve(fd)


if __name__ == "__main__":
    exit_code = _main(sys.argv[1:])
    # Every file it wrote is fsynced and its socket is closed. The interpreter's teardown of
    # torch (about a second, more on a busy node) is skipped: the rank's close(), and with it a
    # preempted job's exit, would wait for it. Log records are flushed as they are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
