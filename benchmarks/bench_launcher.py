"""ft-launcher start-up and recovery speed, side by side with plain torchrun in the same run.

Three scenarios, each on 2 local ranks of the same light worker for both launchers (no torch
import, so the numbers are the launchers' own cost):

* start -> first worker running: from just before the launcher process is spawned to the first
  line of the first worker to start (the worker exits at once).
* hang -> every worker running again: rank 1 stops heartbeating; ft-launcher runs with a 1 s
  heartbeat timeout and a 0.1 s check interval. Measured from the hung rank's last heartbeat to
  the moment the last worker of the new group executes its first line. torchrun has no hang
  detection: it is given the same hang and watched for --torchrun-hang-wait seconds.
* crash -> respawn: rank 1 exits 1. Measured from the crash to the last new worker's first line.

Restarted workers exit as soon as they have recorded their first line: what they do afterwards
is not measured, and it would only make each repeat longer.

    python benchmarks/bench_launcher.py [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import time; T0 = time.time()
import os, sys
from pathlib import Path
out = Path(sys.argv[1]); mode = sys.argv[2]
rank = os.environ["RANK"]; attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"start-{rank}-{attempt}").write_text(f"{T0!r} {os.getpid()}")
if mode == "start" or attempt != "0":
    sys.exit(0)
client = None
if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
    from resiliency.ft import RankMonitorClient
    client = RankMonitorClient(); client.init_workload_monitoring()
for step in range(40):
    if client: client.send_heartbeat()
    if rank == "1" and attempt == "0" and step == 5:
        (out / "fault").write_text(repr(time.time()))
        if mode == "crash": os._exit(1)
        time.sleep(3600)
    time.sleep(0.05)
if client: client.shutdown_workload_monitoring()
"""

COMMON = ["--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1"]
FT_FLAGS = [
    "--ft-workload-check-interval",
    "0.1",
    "--ft-initial-rank-heartbeat-timeout",
    "10",
    "--ft-rank-heartbeat-timeout",
    "1",
    "--ft-stack-dump-timeout",
    "0.5",
    "--workers-stop-timeout",
    "2",
    "--no-gpu-health-check",
]


def _run(launcher: str, mode: str, workdir: Path, wait: float) -> float | None:
    """Run one launcher on the scenario; return its figure in seconds (None: never happened).

    ``start``: launcher spawned -> first worker's first line. ``hang``/``crash``: the fault ->
    the last restarted worker's first line.
    """
    out = Path(tempfile.mkdtemp(dir=workdir))
    script = workdir / "bench_worker.py"
    script.write_text(WORKER)
    if launcher == "ft-launcher":
        cmd = [sys.executable, "-m", "resiliency.launcher", *COMMON, *FT_FLAGS]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *COMMON]
    cmd += [str(script), str(out), mode]
    with open(out / "launcher.log", "w") as log:
        spawned_at = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            pass  # torchrun on a hang: it never restarts, so it is stopped below
        finally:  # also when this benchmark is itself stopped (SIGTERM, Ctrl-C)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            _kill_workers(out)
    result = _figure(out, mode, spawned_at)
    if result is None and not (launcher == "torchrun" and mode == "hang"):
        tail = (out / "launcher.log").read_text()[-3000:]
        print(f"{launcher} {mode}: no result (exit {proc.returncode}); log ends:\n{tail}")
    return result


def _kill_workers(out: Path) -> None:
    """Kill, by the pids they recorded, workers a launcher left behind (e.g. a hung rank)."""
    for start in out.glob("start-*"):
        pid = int(start.read_text().split()[1])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _started_at(path: Path) -> float:
    return float(path.read_text().split()[0])


def _figure(out: Path, mode: str, spawned_at: float) -> float | None:
    if mode == "start":
        first = [out / f"start-{rank}-0" for rank in (0, 1)]
        started = [_started_at(p) for p in first if p.exists()]
        return min(started) - spawned_at if started else None
    fault = out / "fault"
    restarted = [out / f"start-{rank}-1" for rank in (0, 1)]
    if not fault.exists() or not all(p.exists() for p in restarted):
        return None
    # For a hang, the rank sent its last heartbeat in the same step, just before the fault file.
    t_fault = float(fault.read_text())
    return max(_started_at(p) for p in restarted) - t_fault


SCENARIOS = [
    ("start", "start -> first worker running"),
    ("hang", "hang -> all workers running again"),
    ("crash", "crash -> all workers respawned"),
]
LAUNCHERS = ("ft-launcher", "torchrun")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--torchrun-hang-wait", type=float, default=6.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    # Stopped from outside (run.py's time limit, a test's cleanup): unwind, so that every
    # launcher and worker still running is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    results: dict[str, dict[str, list[float | None]]] = {
        mode: {launcher: [] for launcher in LAUNCHERS} for mode, _ in SCENARIOS
    }
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        workdir = Path(tmp)
        # torchrun has no hang detection: it is given the hang once and watched for a while.
        results["hang"]["torchrun"].append(
            _run("torchrun", "hang", workdir, args.torchrun_hang_wait)
        )
        # The launchers alternate within each repeat, so load drift on this shared machine falls
        # on both sides of every comparison.
        for _ in range(args.repeat):
            for mode, _title in SCENARIOS:
                for launcher in LAUNCHERS:
                    if (launcher, mode) != ("torchrun", "hang"):
                        results[mode][launcher].append(_run(launcher, mode, workdir, 60.0))

    def fmt(runs: list[float | None]) -> str:
        done = [r for r in runs if r is not None]
        if not done:
            return "never"
        return (
            f"{statistics.median(done):.3f} s ({min(done):.3f}-{max(done):.3f}, n={len(done)}"
            f"{'' if len(done) == len(runs) else f', {len(runs) - len(done)} failed'})"
        )

    print(f"{'scenario':38s} {'ft-launcher':34s} {'torchrun':34s}")
    for mode, title in SCENARIOS:
        ft, tr = results[mode]["ft-launcher"], results[mode]["torchrun"]
        print(f"{title:38s} {fmt(ft):34s} {fmt(tr)}")
    for mode, title in SCENARIOS:
        ft_done = [r for r in results[mode]["ft-launcher"] if r is not None]
        tr_done = [r for r in results[mode]["torchrun"] if r is not None]
        if ft_done and tr_done:
            delta = statistics.median(ft_done) - statistics.median(tr_done)
            print(f"{title}: ft-launcher - torchrun = {delta * 1000:+.0f} ms (medians)")
    print(
        f"settings: 2 ranks, heartbeat timeout 1 s, check interval 0.1 s, monitor interval 0.1 s; "
        f"torchrun watched {args.torchrun_hang_wait:g} s after the hang"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "results": results,
            "repeat": args.repeat,
            "torchrun_hang_wait_s": args.torchrun_hang_wait,
            "heartbeat_timeout_s": 1.0,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
