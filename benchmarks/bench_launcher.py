"""ft-launcher recovery speed, side by side with plain torchrun in the same run.

Two scenarios, each on 2 local ranks of a light worker (no torch import, so the numbers are the
launchers' own cost):

* hang -> every worker running again: rank 1 stops heartbeating; ft-launcher runs with a 1 s
  heartbeat timeout and a 0.1 s check interval. Measured from the hung rank's last heartbeat to
  the moment the last worker of the new group executes its first line. torchrun has no hang
  detection: it is given the same hang and watched for --torchrun-hang-wait seconds.
* crash -> respawn: rank 1 exits 1. Measured from the crash to the last new worker's first line.

    python benchmarks/bench_launcher.py [--repeat 3] [--json PATH]
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
from pathlib import Path

WORKER = r"""
import time; T0 = time.time()
import os, sys
from pathlib import Path
out = Path(sys.argv[1]); mode = sys.argv[2]
rank = os.environ["RANK"]; attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"start-{rank}-{attempt}").write_text(f"{T0!r} {os.getpid()}")
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
    """Run one launcher on the scenario; return fault -> all restarted seconds (None: never)."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    script = workdir / "bench_worker.py"
    script.write_text(WORKER)
    if launcher == "ft-launcher":
        cmd = [sys.executable, "-m", "resiliency.launcher", *COMMON, *FT_FLAGS]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *COMMON]
    cmd += [str(script), str(out), mode]
    with open(out / "launcher.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    for start in out.glob("start-*"):  # workers of a launcher that never restarted them
        pid = int(start.read_text().split()[1])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    fault = out / "fault"
    restarted = [out / f"start-{rank}-1" for rank in (0, 1)]
    if not fault.exists() or not all(p.exists() for p in restarted):
        return None
    t_fault = float(fault.read_text())
    if mode == "hang":
        t_fault -= 0.05  # the hung rank's last heartbeat was one step before it wrote the fault
    return max(float(p.read_text().split()[0]) for p in restarted) - t_fault


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torchrun-hang-wait", type=float, default=6.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    results: dict[str, dict[str, list[float | None]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        workdir = Path(tmp)
        for mode in ("hang", "crash"):
            for launcher in ("ft-launcher", "torchrun"):
                runs: list[float | None] = []
                for _ in range(args.repeat if (launcher, mode) != ("torchrun", "hang") else 1):
                    wait = args.torchrun_hang_wait if launcher == "torchrun" else 60.0
                    if mode == "crash":
                        wait = 60.0
                    runs.append(_run(launcher, mode, workdir, wait))
                results.setdefault(mode, {})[launcher] = runs

    def fmt(runs: list[float | None]) -> str:
        done = [r for r in runs if r is not None]
        if not done:
            return "never restarted"
        return f"{statistics.median(done):.3f} s (min {min(done):.3f}, n={len(done)})"

    rows = [
        ("hang -> all workers running again", "hang"),
        ("crash -> all workers respawned", "crash"),
    ]
    print(f"{'scenario':38s} {'ft-launcher':32s} {'torchrun':32s}")
    for title, mode in rows:
        print(
            f"{title:38s} {fmt(results[mode]['ft-launcher']):32s} {fmt(results[mode]['torchrun'])}"
        )
    crash_ft = [r for r in results["crash"]["ft-launcher"] if r is not None]
    crash_tr = [r for r in results["crash"]["torchrun"] if r is not None]
    if crash_ft and crash_tr:
        delta = statistics.median(crash_ft) - statistics.median(crash_tr)
        print(f"crash respawn: ft-launcher - torchrun = {delta * 1000:+.0f} ms (median)")
    print("settings: 2 ranks, heartbeat timeout 1 s, check interval 0.1 s, monitor interval 0.1 s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "repeat": args.repeat}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
