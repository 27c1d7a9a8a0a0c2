"""Run nox sessions in two lanes at once, each session a child ``nox -s NAME``; report them all.

    python tools/nox_lanes.py --lane a,b,c --lane d,e [--session-timeout S] [-- POSARGS]

``nox`` (the README's test command) runs its ``suite`` session, which runs this. On this 2-core
machine the multi-process sessions keep ~1.9 cores busy but the others leave most of a core idle
(ft_core 1.1, ptl 1.45, simulator 1.26), and nox itself runs sessions one after the other. So
each lane runs its sessions in order, one at a time, beside the other lane; a lane whose list is
done takes the next session of the other lane, so both end together. A name stands for every
session nox lists under it (``ft_core`` -> ``ft_core-3.10`` ... ``ft_core-3.13``).

Each session's output goes to ``.nox/_lanes/NAME.log`` and is printed whole when the session
ends, so two sessions' lines never interleave; in between, a line every minute names what runs.
The end is a table of every session's time, slowest first, and the exit status is 1 when any
session failed (every failed session is named, with its log). POSARGS go to every session.
A child session still running when this process is stopped (SIGINT, SIGTERM) is stopped with
it: its whole process group gets SIGTERM, then SIGKILL after 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
LOG_DIR = ROOT / ".nox" / "_lanes"
#: How often the runner looks for ended sessions (a poll of child processes, not a timed wait).
_POLL_S = 0.2
_PROGRESS_EVERY_S = 60.0
_KILL_AFTER_S = 10.0


#: The command line that runs one session, from its name.
Command = Callable[[str], list[str]]


class Result(NamedTuple):
    """One session's end: its verdict, its wall time and the CPU time its processes used."""

    name: str
    verdict: str
    seconds: float
    #: user + system time of the child nox and every descendant it or theirs waited for
    #: (``wait4``'s rusage), so pytest's workers and the jobs they ran are counted; 0.0 when
    #: the session was stopped.
    cpu_seconds: float


class LanesError(RuntimeError):
    """The lanes cannot be run as asked (an unknown session name, nox not listing sessions)."""


@dataclass
class Running:
    """One child ``nox -s NAME`` and what is known of it."""

    name: str
    lane: int
    proc: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]
    deadline: float
    started: float = field(default_factory=time.monotonic)


def nox_command() -> list[str]:
    """How to start nox: the interpreter running this script has it (it runs nox's sessions)."""
    return [sys.executable, "-m", "nox", "--noxfile", str(ROOT / "noxfile.py")]


def expand(lanes: list[list[str]], listed: list[dict[str, object]]) -> list[list[str]]:
    """Replace each name by the sessions nox lists under it, in nox's order.

    Args:
        lanes: the session names of each lane.
        listed: ``nox -l --json``'s entries (``session``: the full name, ``name``: the function).

    Raises:
        LanesError: a name nox does not list, or one named twice.
    """
    out: list[list[str]] = []
    seen: set[str] = set()
    for lane in lanes:
        sessions: list[str] = []
        for name in lane:
            matches = [str(e["session"]) for e in listed if name in (e["session"], e["name"])]
            if not matches:
                raise LanesError(f"no nox session named {name!r}: see `nox -l`")
            if seen & set(matches):
                raise LanesError(f"session {name!r} is in the lanes twice")
            seen.update(matches)
            sessions += matches
        out.append(sessions)
    return out


def list_sessions(names: list[str]) -> list[dict[str, object]]:
    """nox's own list of the sessions these names stand for (``nox -l --json -s NAMES``)."""
    result = subprocess.run(
        [*nox_command(), "-l", "--json", "-s", *names],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise LanesError(
            f"`nox -l --json -s ...` failed ({result.returncode}): {result.stderr[-2000:]}"
        )
    entries = json.loads(result.stdout)
    if not isinstance(entries, list):
        raise LanesError(f"`nox -l --json` printed {type(entries).__name__}, not a list")
    return entries


def session_command(posargs: list[str]) -> Command:
    """``nox -s NAME [-- POSARGS]`` for each session name."""
    tail = ["--", *posargs] if posargs else []
    return lambda name: [*nox_command(), "-s", name, *tail]


def _start(name: str, lane: int, command: Command, log_dir: Path, timeout: float) -> Running:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    log_file = log.open("wb")
    # Its own session: the whole process group (pytest, its workers, their jobs) can be stopped
    # by the group's id, which is the child's pid.
    proc = subprocess.Popen(
        command(name),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    running = Running(name, lane, proc, log, log_file, time.monotonic() + timeout)
    print(f"suite > lane {lane}: {name} started (pid {proc.pid}, log {log})", flush=True)
    return running


def _stop_group(running: Running) -> None:
    """SIGTERM the session's process group; SIGKILL what is left of it after a grace time."""
    try:
        os.killpg(running.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        running.proc.wait(_KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        print(
            f"suite > {running.name}: still running {_KILL_AFTER_S:g} s after SIGTERM", flush=True
        )
    # The group can outlive the child nox (pytest's workers, the jobs they started).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.proc.pid, signal.SIGKILL)
    running.proc.wait(_KILL_AFTER_S)
    deadline = time.monotonic() + _KILL_AFTER_S
    while _group_alive(running.proc.pid):
        if time.monotonic() > deadline:
            print(f"suite > {running.name}: its process group outlived SIGKILL", flush=True)
            return
        time.sleep(_POLL_S)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(running: Running) -> tuple[int, float] | None:
    """The session's exit status and CPU seconds once it has ended; None while it runs.

    ``wait4`` rather than ``Popen.poll``: its rusage holds the CPU time of the child and of
    every descendant reaped below it, which ``poll`` throws away.
    """
    pid, status, usage = os.wait4(running.proc.pid, os.WNOHANG)
    if pid == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    running.proc.returncode = code  # reaped here: Popen must not wait for it again
    return code, usage.ru_utime + usage.ru_stime


def _report(running: Running, result: Result) -> None:
    running.log_file.close()
    text = running.log.read_text(encoding="utf-8", errors="replace")
    print(f"====== {running.name}: its whole output ({running.log}) ======", flush=True)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    print(f"====== end of {running.name} ======", flush=True)
    print(
        f"suite > {running.name} {result.verdict} in {result.seconds:.1f} s (lane {running.lane}, "
        f"{result.cpu_seconds:.1f} s of CPU)",
        flush=True,
    )


def run_lanes(
    lanes: list[list[str]], command: Command, timeout: float, log_dir: Path = LOG_DIR
) -> list[Result]:
    """Run the sessions, one per lane at a time; return each one's result.

    Args:
        lanes: each lane's session names, in order.
        command: the command line that runs one session.
        timeout: seconds after which a session still running is stopped (and failed).
        log_dir: where each session's output is kept, as ``NAME.log``.
    """
    queues = [deque(lane) for lane in lanes]
    slots: list[Running | None] = [None] * len(queues)
    results: list[Result] = []
    next_progress = time.monotonic() + _PROGRESS_EVERY_S
    try:
        while True:
            for lane, slot in enumerate(slots):
                if slot is not None:
                    continue
                # Its own list first; then the front of another lane's list, so none is left
                # waiting while a lane stands idle.
                queue = queues[lane] if queues[lane] else next((q for q in queues if q), None)
                if queue is not None:
                    slots[lane] = _start(queue.popleft(), lane, command, log_dir, timeout)
            if all(s is None for s in slots):
                return results
            time.sleep(_POLL_S)
            now = time.monotonic()
            for lane, slot in enumerate(slots):
                if slot is None:
                    continue
                ended = _reap(slot)
                if ended is None and now < slot.deadline:
                    continue
                if ended is None:
                    _stop_group(slot)
                    verdict, cpu = f"timed out after {timeout:g} s and was stopped", 0.0
                else:
                    code, cpu = ended
                    verdict = "passed" if code == 0 else f"failed (exit status {code})"
                result = Result(slot.name, verdict, now - slot.started, cpu)
                results.append(result)
                _report(slot, result)
                slots[lane] = None
            if now >= next_progress:
                next_progress = now + _PROGRESS_EVERY_S
                busy = ", ".join(
                    f"{s.name} {now - s.started:.0f} s" for s in slots if s is not None
                )
                left = sum(len(q) for q in queues)
                print(f"suite > running: {busy}; {left} session(s) waiting", flush=True)
    finally:
        for slot in slots:
            if slot is not None:
                _stop_group(slot)
                slot.log_file.close()


def summary(results: list[Result], wall: float, log_dir: Path = LOG_DIR) -> str:
    """The closing table: every session's wall and CPU time, slowest first, then the failures."""
    lines = ["suite > every session, slowest first (wall, CPU):"]
    lines += [
        f"  {r.seconds:7.1f} s  {r.cpu_seconds:7.1f} s  {r.name:<24} {r.verdict}"
        for r in sorted(results, key=lambda r: -r.seconds)
    ]
    failed = [(r.name, r.verdict) for r in results if r.verdict != "passed"]
    lines.append(
        f"suite > {len(results)} session(s) in {wall:.1f} s of wall time "
        f"({sum(r.seconds for r in results):.1f} s of session time, "
        f"{sum(r.cpu_seconds for r in results):.1f} s of CPU, two lanes at once): "
        f"{len(results) - len(failed)} passed, {len(failed)} failed"
    )
    lines += [f"suite > FAILED {n}: {v}; its log: {log_dir / (n + '.log')}" for n, v in failed]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lane",
        action="append",
        required=True,
        metavar="A,B,...",
        help="the sessions of one lane, in order (repeat for each lane)",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="stop a session still running after S seconds (default 3600)",
    )
    parser.add_argument("posargs", nargs="*", help="passed to every session (after --)")
    args = parser.parse_args(argv)
    try:
        named = [[n for n in lane.split(",") if n] for lane in args.lane]
        lanes = expand(named, list_sessions([n for lane in named for n in lane]))
    except LanesError as exc:
        print(f"suite: {exc}", file=sys.stderr)
        return 2
    # SIGTERM ends this process the way Ctrl-C does, so `finally` stops the running sessions.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    results = run_lanes(lanes, session_command(args.posargs), args.session_timeout)
    print(summary(results, time.monotonic() - started), flush=True)
    return 0 if all(r.verdict == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
