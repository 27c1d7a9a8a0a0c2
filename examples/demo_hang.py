"""Hang-detection demo: a real rank and its rank monitor.

Starts a rank monitor with short timeouts, spawns a training rank (examples/_demo_rank.py) that
trains a few steps and then hangs inside a collective, and shows the monitor detecting the hang,
dumping the rank's Python stacks and killing it. Exits 0 when all of that happened as expected.

    python examples/demo_hang.py
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from resiliency.ft import (
    IPC_SOCKET_ENV,
    FaultToleranceConfig,
    MonitorEvent,
    MonitorProcess,
    create_socket_dir,
    socket_path_for,
)

RANK_SCRIPT = Path(__file__).with_name("_demo_rank.py")
HUNG_FUNCTION = "all_reduce_gradients"
DEADLINE_S = 20.0


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def relay_output(proc: subprocess.Popen[str], lines: queue.Queue[tuple[float, str]]) -> None:
    """Print the rank's output as it comes, and keep each line with its arrival time."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put((time.monotonic(), line.rstrip()))
        print(f"[rank 0] {line.rstrip()}", flush=True)


def last_heartbeat(lines: queue.Queue[tuple[float, str]]) -> float | None:
    latest = None
    while not lines.empty():
        _, line = lines.get_nowait()
        if "heartbeat sent at t=" in line:
            latest = float(line.rsplit("t=", 1)[1])
    return latest


def main() -> int:
    started = time.monotonic()
    cfg = FaultToleranceConfig(
        initial_rank_heartbeat_timeout=15.0,
        rank_heartbeat_timeout=3.0,
        rank_section_timeouts={"train_step": 1.0},
        stack_dump_timeout=2.0,
        termination_grace_period=2.0,
    )
    sock_dir = create_socket_dir("ft-demo-")
    rank: subprocess.Popen[str] | None = None
    say("starting the rank monitor for local rank 0 (its log lines start with [ft-monitor])")
    monitor = MonitorProcess.start(cfg, socket_path_for(sock_dir, 0), 0)
    try:
        env = {**os.environ, IPC_SOCKET_ENV: str(monitor.socket_path), "RANK": "0"}
        env["PYTHONUNBUFFERED"] = "1"
        rank = subprocess.Popen(
            [sys.executable, str(RANK_SCRIPT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        monitor.worker_started(rank.pid, rank=0)
        say(f"spawned rank 0 (pid {rank.pid}); section 'train_step' may last at most 1.0 s")
        lines: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=relay_output, args=(rank, lines), daemon=True).start()

        events: dict[str, MonitorEvent] = {}
        heartbeat_at: float | None = None
        detected_at: float | None = None
        while "killed" not in events and time.monotonic() - started < DEADLINE_S:
            for event in monitor.poll_events(timeout=0.2):
                events.setdefault(event.kind, event)
                if event.kind == "hang":
                    detected_at = time.monotonic()
            heartbeat_at = last_heartbeat(lines) or heartbeat_at
        code = rank.wait(timeout=5)
    finally:
        if rank is not None and rank.poll() is None:
            rank.kill()
            rank.wait(5)
        monitor.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)
    return report(events, heartbeat_at, detected_at, code, time.monotonic() - started)


def report(
    events: dict[str, MonitorEvent],
    heartbeat_at: float | None,
    detected_at: float | None,
    exit_code: int,
    took: float,
) -> int:
    hang, killed = events.get("hang"), events.get("killed")
    problems = []
    if hang is None or killed is None:
        problems.append(f"expected a hang and a kill, got events {sorted(events)}")
    else:
        if hang.timer != "section:train_step":
            problems.append(f"expected the 'train_step' section timer, got {hang.timer}")
        if not hang.stack_dump or HUNG_FUNCTION not in hang.stack_dump:
            problems.append(f"the stack dump does not show {HUNG_FUNCTION}()")
        if killed.signal != "SIGTERM" or exit_code != -15:
            problems.append(
                f"expected the rank killed by SIGTERM, got {killed.signal} / {exit_code}"
            )
    if took > DEADLINE_S:
        problems.append(f"the demo took {took:.1f} s (more than {DEADLINE_S:.0f} s)")
    if hang is not None and hang.stack_dump:
        print("\n----- stack dump the monitor collected from the hung rank -----")
        print(hang.stack_dump.rstrip())
        print("---------------------------------------------------------------\n")
    if problems:
        for problem in problems:
            say(f"UNEXPECTED: {problem}")
        return 1
    assert hang is not None and killed is not None and detected_at is not None
    since = (
        f", reported {detected_at - heartbeat_at:.1f} s after its last heartbeat"
        if heartbeat_at
        else ""
    )
    section = (hang.timer or "").removeprefix("section:")
    say(
        f"summary: rank 0 hung in section {section!r}; detected {hang.elapsed:.1f} s into the "
        f"section (limit {hang.limit:.1f} s){since}; stack dumped; killed by {killed.signal} "
        f"(demo took {took:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
