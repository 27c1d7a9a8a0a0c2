"""Facts about other processes, read from /proc: parent, start time, state, liveness.

The monitor signals processes it did not spawn (the launcher did), so it cannot ``waitpid`` them.
It tells a live worker from a zombie, and a worker from an unrelated process that reused its pid,
through ``/proc/<pid>/stat``. Where /proc is missing it falls back to ``kill(pid, 0)``.
"""

from __future__ import annotations

import os

_MAX_ANCESTRY_DEPTH = 64
_HAVE_PROC = os.path.exists("/proc/self/stat")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses.
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def parent_pid(pid: int) -> int | None:
    """Return the parent of ``pid``, or None when it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def process_start_time(pid: int) -> int | None:
    """Return a process's start time (clock ticks since boot), or None when it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """Tell whether ``pid`` is a running (not zombie) process, and the same one as before.

    Args:
        pid: The process id.
        start_time: Its start time as returned by :func:`process_start_time` when it was first
            seen; a different start time means the pid was reused by another process.

    Returns:
        True when the process runs (and, given ``start_time``, is the same process).
    """
    if not _HAVE_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X", "x"):
        return False
    return start_time is None or int(fields[19]) == start_time


def is_same_or_descendant(pid: int, ancestor: int) -> bool:
    """Tell whether ``pid`` is ``ancestor`` or one of its descendants.

    Args:
        pid: The process to check.
        ancestor: The expected ancestor.

    Returns:
        True when walking the parent chain from ``pid`` reaches ``ancestor``.
    """
    current: int | None = pid
    for _ in range(_MAX_ANCESTRY_DEPTH):
        if current == ancestor:
            return True
        if current is None or current <= 1:
            return False
        current = parent_pid(current)
    return False
