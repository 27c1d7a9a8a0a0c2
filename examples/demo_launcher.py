"""Demo: ft-launcher finds a hung rank, kills it, restarts the group, and training finishes.

Runs ``examples/train_ddp_heartbeats.py`` (real DDP on CPU over gloo) on 3 local ranks with a
hang injected on rank 1 at step 8 of the first attempt, then prints a short summary. The full
launcher log is written next to the checkpoint (see the last line of the summary).

    python examples/demo_launcher.py [--nproc 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--hang-step", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=240.0, help="give up after this long")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ft-demo-"))
    flag, status, log_path = work / "finished", work / "status.json", work / "launcher.log"
    cmd = [
        sys.executable,
        "-m",
        "resiliency.launcher",
        "--nproc-per-node",
        str(args.nproc),
        "--max-restarts",
        "2",
        "--monitor-interval",
        "0.1",
        "--ft-workload-check-interval",
        "0.2",
        "--ft-initial-rank-heartbeat-timeout",
        "60",
        "--ft-rank-heartbeat-timeout",
        "2",
        "--ft-stack-dump-timeout",
        "1",
        "--workers-stop-timeout",
        "5",
        "--finished-flag-file",
        str(flag),
        "--exit-status-file",
        str(status),
        str(HERE / "train_ddp_heartbeats.py"),
        "--ckpt-dir",
        str(work / "ckpt"),
        "--steps",
        "20",
        "--hang-rank",
        str(args.hang_rank),
        "--hang-step",
        str(args.hang_step),
    ]
    print(
        f"ft-launcher: {args.nproc} ranks, hang injected on rank {args.hang_rank} "
        f"at step {args.hang_step}; heartbeat timeout 2 s ...",
        flush=True,
    )
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)
        )
        try:
            code = proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)
            print(f"demo FAILED: the launcher did not finish within {args.timeout:.0f} s")
            print(f"log: {log_path}")
            return 1
    took = time.monotonic() - start
    text = log_path.read_text(errors="replace")
    verdict = json.loads(status.read_text()) if status.exists() else {}

    def first(needle: str) -> str:
        return next((line.split("] ", 1)[-1] for line in text.splitlines() if needle in line), "-")

    print("summary")
    print(f"  hang detected : {first(' hung: ')}")
    print(f"  stack dumps   : {first('hang verdict:')}")
    print(
        f"  restarted     : {verdict.get('restarts', '?')} time(s); "
        f"resumed: {first('resumes at step')}"
    )
    print(f"  finished      : {'yes' if flag.exists() else 'NO'} ({first('finished 20 steps')})")
    print(f"  launcher exit : {code} in {took:.1f} s")
    named = f"likely culprit: rank {args.hang_rank}" in text
    ok = code == 0 and flag.exists() and verdict.get("hangs_detected", 0) >= 1 and named
    print("demo OK" if ok else f"demo FAILED; log: {log_path}")
    if args.keep or not ok:
        print(f"work directory: {work}")
    else:
        shutil.rmtree(work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
