"""How long after the configured timeout a rank monitor acts on a hung rank.

One real rank monitor (``resiliency.ft.MonitorProcess``) and one real rank subprocess that sends
a few heartbeats and then stops (it sleeps, as a rank stuck in a collective would). The monitor
runs with a 1 s heartbeat timeout and a 0.1 s check interval. Per repeat, measured from the
rank's last heartbeat (the rank's own clock, taken just before the send):

* ``hang_event``: until the controller (the launcher's role) receives the ``hang`` event, which
  carries the stack dump, so it includes the dump's collection.
* ``killed_event``: until the controller hears that the rank is gone (SIGTERM handled).
* ``monitor_overdue``: the monitor's own account of how late it noticed the expired timer
  (``elapsed - limit`` in the hang event; its timer starts when the heartbeat arrives).

Every figure is reported as time *beyond* the 1 s timeout; the median over ``--repeats`` repeats.

    python benchmarks/bench_hang_monitor.py [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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

TIMEOUT_S = 1.0
CHECK_INTERVAL_S = 0.1
EVENT_DEADLINE_S = 15.0

RANK = r"""
import sys, time
from resiliency.ft import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
for _ in range(5):
    last = time.time()
    client.send_heartbeat()
    time.sleep(0.05)
print(repr(last), flush=True)
time.sleep(3600)
"""


def _one_repeat(workdir: Path, index: int) -> dict[str, float]:
    """Run one rank until its monitor kills it; return the figures of this repeat (seconds)."""
    cfg = FaultToleranceConfig(
        initial_rank_heartbeat_timeout=10.0,
        rank_heartbeat_timeout=TIMEOUT_S,
        workload_check_interval=CHECK_INTERVAL_S,
        stack_dump_timeout=2.0,
        termination_grace_period=2.0,
    )
    sock_dir = create_socket_dir("ft-bench-hang-")
    with open(workdir / f"monitor-{index}.log", "w") as monitor_log:
        monitor = MonitorProcess.start(cfg, socket_path_for(sock_dir, 0), 0, stderr=monitor_log)
    rank: subprocess.Popen[str] | None = None
    try:
        env = {**os.environ, IPC_SOCKET_ENV: str(monitor.socket_path), "RANK": "0"}
        rank = subprocess.Popen(
            [sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True
        )
        monitor.worker_started(rank.pid, rank=0)
        received: dict[str, tuple[float, MonitorEvent]] = {}
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while "killed" not in received and time.monotonic() < deadline:
            for event in monitor.poll_events(timeout=0.05):
                received.setdefault(event.kind, (time.time(), event))
        if "hang" not in received or "killed" not in received:
            log_tail = (workdir / f"monitor-{index}.log").read_text()[-2000:]
            raise RuntimeError(
                f"repeat {index}: expected a hang and a kill within {EVENT_DEADLINE_S} s, got "
                f"{sorted(received)}; the monitor's log ends with:\n{log_tail}"
            )
        assert rank.stdout is not None
        last_heartbeat = float(rank.stdout.readline())
        hang_at, hang = received["hang"]
        killed_at, _ = received["killed"]
        assert hang.elapsed is not None and hang.limit is not None
        return {
            "hang_event": hang_at - last_heartbeat - TIMEOUT_S,
            "killed_event": killed_at - last_heartbeat - TIMEOUT_S,
            "monitor_overdue": hang.elapsed - hang.limit,
        }
    finally:
        if rank is not None and rank.poll() is None:
            rank.kill()
        if rank is not None:
            rank.wait(5)
        monitor.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="repeats (median is reported)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="bench-hang-"))
    try:
        repeats = [_one_repeat(workdir, i) for i in range(args.repeats)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    runs = {key: [r[key] for r in repeats] for key in repeats[0]}

    rows = [
        ("hang_event", "hang -> hang event (with stacks) at controller"),
        ("killed_event", "hang -> rank gone, reported to controller"),
        ("monitor_overdue", "monitor's own overdue figure (elapsed - limit)"),
    ]
    print(
        f"rank monitor, heartbeat timeout {TIMEOUT_S:g} s, check interval {CHECK_INTERVAL_S:g} s, "
        f"{args.repeats} repeats; seconds BEYOND the timeout"
    )
    print(f"{'figure':<50}{'median':>9}{'min':>9}{'max':>9}")
    for key, title in rows:
        values = runs[key]
        print(f"{title:<50}{statistics.median(values):>9.3f}{min(values):>9.3f}{max(values):>9.3f}")
    if args.json is not None:
        payload = {
            "runs": runs,
            "timeout_s": TIMEOUT_S,
            "check_interval_s": CHECK_INTERVAL_S,
            "repeats": args.repeats,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
