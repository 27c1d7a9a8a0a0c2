"""Restart cost of workers that import torch and Lightning: new processes vs forked ones.

One scenario, side by side in one run: N local ranks of a worker whose first lines import
``--modules`` (default ``torch,lightning``); rank 1 crashes once. Measured from the crash to
the moment the LAST restarted worker has its imports done (its first line after them), for

* torchrun (new processes),
* ft-launcher (new processes),
* ft-launcher ``--ft-preimport MODULES`` (workers forked from a server that imported them once).

    python benchmarks/bench_fork_server.py [--repeat 3] [--nproc 4] [--json PATH]
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
import importlib, os, sys, time
from pathlib import Path
out = Path(sys.argv[1]); modules = sys.argv[2]
for name in modules.split(","):
    importlib.import_module(name)
rank = os.environ["RANK"]; attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"ready-{rank}-{attempt}").write_text(f"{time.time()!r} {os.getpid()}")
if attempt != "0":
    sys.exit(0)
client = None
if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
    from resiliency.ft import RankMonitorClient
    client = RankMonitorClient(); client.init_workload_monitoring()
while not (out / "go").exists():  # every rank up before the crash: one restart, measured
    time.sleep(0.05)
if rank == "1":
    (out / "fault").write_text(repr(time.time()))
    os._exit(1)
time.sleep(600)
"""

FT_FLAGS = [
    "--monitor-interval",
    "0.1",
    "--ft-workload-check-interval",
    "0.1",
    "--ft-initial-rank-heartbeat-timeout",
    "120",
    "--ft-rank-heartbeat-timeout",
    "null",
    "--workers-stop-timeout",
    "2",
    "--no-gpu-health-check",
]
SETUPS = ("torchrun", "ft-launcher", "ft-launcher --ft-preimport")


def _command(setup: str, nproc: int, modules: str, script: Path, out: Path) -> list[str]:
    common = ["--nproc-per-node", str(nproc), "--max-restarts", "1"]
    if setup == "torchrun":
        head = [sys.executable, "-m", "torch.distributed.run", *common, "--monitor-interval", "0.1"]
    else:
        head = [sys.executable, "-m", "resiliency.launcher", *common, *FT_FLAGS]
        if setup.endswith("--ft-preimport"):
            head += ["--ft-preimport", modules]
    return [*head, str(script), str(out), modules]


def _run(setup: str, nproc: int, modules: str, workdir: Path) -> float | None:
    """One run; crash -> the last restarted worker's imports done, in seconds."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    script = workdir / "bench_worker.py"
    script.write_text(WORKER)
    with open(out / "launcher.log", "w") as log:
        proc = subprocess.Popen(
            _command(setup, nproc, modules, script, out),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 300
            while len(list(out.glob("ready-*-0"))) < nproc and time.monotonic() < deadline:
                time.sleep(0.05)
            (out / "go").touch()
            proc.wait(300)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            for ready in out.glob("ready-*"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(ready.read_text().split()[1]), signal.SIGKILL)
    fault = out / "fault"
    restarted = [out / f"ready-{rank}-1" for rank in range(nproc)]
    if not fault.exists() or not all(p.exists() for p in restarted):
        print(f"{setup}: no result; log ends:\n{(out / 'launcher.log').read_text()[-3000:]}")
        return None
    t_fault = float(fault.read_text())
    return max(float(p.read_text().split()[0]) for p in restarted) - t_fault


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--modules", default="torch,lightning")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, list[float | None]] = {setup: [] for setup in SETUPS}
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        for _ in range(args.repeat):  # alternating, so load drift falls on every setup
            for setup in SETUPS:
                results[setup].append(_run(setup, args.nproc, args.modules, Path(tmp)))
    print(
        f"crash -> all {args.nproc} restarted workers past 'import {args.modules}' "
        f"(median, min-max, n={args.repeat})"
    )
    for setup, runs in results.items():
        done = [r for r in runs if r is not None]
        text = (
            f"{statistics.median(done):7.2f} s ({min(done):.2f}-{max(done):.2f})"
            if done
            else "never"
        )
        print(f"  {setup:30s} {text}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"nproc": args.nproc, "modules": args.modules, "results": results}) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
