"""Find a launcher's workers among its descendants, by pid and environment, never by name."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from resiliency.simulator._contracts import FORKED_ENVIRON_DIR_VAR

logger = logging.getLogger(__name__)

_PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    """A process seen in /proc: its pid, parent, process group and start time (clock ticks)."""

    pid: int
    ppid: int
    pgid: int
    start_ticks: int


def read_proc(pid: int) -> Proc | None:
    """Return what /proc says of ``pid``, or None when it is gone (or exited, not yet reaped)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and parentheses: the fixed fields follow the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # a zombie has exited: nothing to signal or wait for
        return None
    return Proc(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), start_ticks=int(fields[19]))


def still_same(proc: Proc) -> bool:
    """Whether ``proc.pid`` is still the same process (not a reused pid)."""
    now = read_proc(proc.pid)
    return now is not None and now.start_ticks == proc.start_ticks


def descendants(root: int) -> list[Proc]:
    """Every live descendant of ``root`` (not root itself), parents before children."""
    by_parent: dict[int, list[Proc]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            proc = read_proc(int(entry.name))
            if proc is not None:
                by_parent.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    frontier = [root]
    while frontier:
        children = by_parent.get(frontier.pop(0), [])
        found.extend(children)
        frontier.extend(c.pid for c in children)
    return found


def environment(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with; empty when it cannot be read.

    A worker forked by ft-launcher's fork server (``--ft-preimport``) still shows the server's
    environment in /proc; its own is the one it published (see ``FORKED_ENVIRON_DIR_VAR``).
    """
    env = _parse_environ(_PROC / str(pid) / "environ")
    published = env.get(FORKED_ENVIRON_DIR_VAR)
    if published:
        return _parse_environ(Path(published) / str(pid)) or env
    return env


def _parse_environ(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def catches_signal(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler installed for ``signum`` (its SigCgt mask in /proc)."""
    try:
        status = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def workers(launcher_pid: int) -> dict[int, Proc]:
    """The launcher's worker processes, keyed by their global ``RANK``.

    A worker is the topmost descendant whose environment carries torchelastic's ``RANK`` and
    ``LOCAL_RANK``; its own children (data-loader workers) inherit that environment and are
    skipped, and the launcher's monitor processes carry no ``RANK``.
    """
    found: dict[int, Proc] = {}
    worker_pids: set[int] = set()
    for proc in descendants(launcher_pid):
        env = environment(proc.pid)
        if "RANK" not in env or "LOCAL_RANK" not in env or proc.ppid in worker_pids:
            if proc.ppid in worker_pids:
                worker_pids.add(proc.pid)
            continue
        try:
            rank = int(env["RANK"])
        except ValueError:
            logger.warning("pid %d has a non-numeric RANK=%r; not a worker", proc.pid, env["RANK"])
            continue
        found[rank] = proc
        worker_pids.add(proc.pid)
    return found


def kill_all(procs: list[Proc]) -> int:
    """SIGKILL every process of ``procs`` that is still the same process; return how many."""
    killed = 0
    for proc in procs:
        if still_same(proc):
            try:
                os.kill(proc.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                continue
    return killed
