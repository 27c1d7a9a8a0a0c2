"""The monitor process of one rank: ``python .../_monitor_process_main.py FD RANK_PID ...``.

Run by its path (not ``-m``), so it imports only the standard library: not this package, whose
``__init__`` imports torch. It reads the beats the rank's beat thread writes to the pipe ``FD``
and ends the rank when they stop for longer than the limit while the pipe is still open and no
``_SUSPEND`` byte is waiting for its ``_RESUME``: the rank's Python threads could not run (the
main thread holds the GIL in a C call), so neither its monitor thread nor any signal handler can
end the hang from inside. It then writes the launcher's
respawn request (when given a path), sends SIGTERM and, after the grace time, SIGKILL. It ends
with the rank: at the pipe's EOF, or by its parent-death signal.

Arguments: FD RANK_PID RANK INTERVAL_S LIMIT_S GRACE_S RESPAWN_REQUEST_PATH LOGFILE, the last two
``-`` for none (its messages then go to stderr, the rank's log).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
#: The rank's last byte: its wrapped call is over. The pipe's end alone would not do: a process
#: the rank forked meanwhile (a DataLoader worker) holds a copy of the write end.
_STOP = b"x"
#: ``CallWrapper.disable_hang_protection()``: no end for a silence between these two bytes.
_SUSPEND = b"s"
_RESUME = b"r"


def _die_with(parent: int) -> None:
    """SIGKILL this process when the rank dies; exit now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError) as exc:  # not Linux: the pipe's EOF still ends it
        sys.stderr.write(f"[inprocess monitor_process] no parent-death signal: {exc}\n")
    if os.getppid() != parent:
        os._exit(0)


_LOGFILE: list[str] = []  # set once by _main: the Wrapper's monitor_process_logfile


def _say(rank: int, pid: int, text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    # "monitor_process" and "target_pid" as in NVRx's lines, which its users' tooling greps
    line = f"{stamp} [inprocess monitor_process] rank {rank} (target_pid={pid}): {text}\n"
    if _LOGFILE:
        try:
            with open(_LOGFILE[0], "a") as f:
                f.write(line)
            return
        except OSError as exc:
            sys.stderr.write(f"[inprocess monitor_process] cannot write {_LOGFILE[0]}: {exc}\n")
    sys.stderr.write(line)
    sys.stderr.flush()


def _request_respawn(path: str, reason: str) -> None:
    """Write the launcher's request whole (a temporary file renamed): it may read it any time."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(tmp, "w") as f:
        f.write(reason)
    os.replace(tmp, path)


def _end(rank: int, pid: int, *, silent: float, limit: float, grace: float, respawn: str) -> None:
    reason = (
        f"rank {rank} could not be aborted in-process: its Python threads did not run for "
        f"{silent:.1f} s (hard_timeout {limit:g} s): its main thread holds the GIL"
    )
    if respawn:
        try:
            _request_respawn(respawn, reason)
        except OSError as exc:
            _say(rank, pid, f"could not ask the launcher for a respawn ({respawn}): {exc}")
    _say(rank, pid, f"{reason}; SIGTERM, then SIGKILL after {grace:g} s")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    time.sleep(grace)  # the rank's death ends this process first (parent-death signal)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _suspended_after(data: bytes, suspended: bool) -> bool:
    """Whether the hang protection is off after ``data``: its last suspend or resume byte."""
    at_suspend, at_resume = data.rfind(_SUSPEND), data.rfind(_RESUME)
    if at_suspend == at_resume:  # neither: beats only
        return suspended
    return at_suspend > at_resume


def _main(argv: list[str]) -> int:
    if len(argv) != 8:
        sys.stderr.write(
            f"usage: {sys.argv[0]} FD RANK_PID RANK INTERVAL LIMIT GRACE RESPAWN|- LOGFILE|-\n"
        )
        return 2
    fd, pid, rank = int(argv[0]), int(argv[1]), int(argv[2])
    interval, limit, grace = float(argv[3]), float(argv[4]), float(argv[5])
    respawn = "" if argv[6] == "-" else argv[6]
    if argv[7] != "-":
        _LOGFILE.append(argv[7])
    _die_with(pid)
    if _LOGFILE:  # on the rank's stderr, one line per rank and start would be noise
        _say(rank, pid, f"watching: ends the rank after {limit:g} s without a beat")
    # A SIGTERM to the rank's process group (a launcher stopping the workers) ends the rank,
    # and with it this process: nothing of its own to finish.
    last = time.monotonic()
    suspended = False
    while True:
        readable, _, _ = select.select([fd], [], [], interval)
        if readable:
            data = os.read(fd, 4096)
            if not data or _STOP in data:
                return 0  # the wrapped call is over (a stop byte, or the pipe closed)
            suspended = _suspended_after(data, suspended)
            last = time.monotonic()
            continue
        silent = time.monotonic() - last
        if silent > limit and not suspended:
            _end(rank, pid, silent=silent, limit=limit, grace=grace, respawn=respawn)
            return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
