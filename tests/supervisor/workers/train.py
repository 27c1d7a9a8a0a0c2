"""A training loop stand-in for the supervisor tests (no collectives: each rank steps alone).

Every step sleeps ``--step-s`` and sends a heartbeat to its rank monitor; on a node started with
``SUPERVISOR_TEST_SLOW=1`` it sleeps ``--slow-factor`` times longer once
``<marker-dir>/inject-slow`` exists (the injected fault). Every ``--report-s`` seconds it writes
a ``straggler_detected`` goodput event with its own score (expected / measured step time, kind
``individual``); rank 0 records its steps. It keeps its progress in ``progress-<rank>`` (its
"checkpoint": a rank restarted anywhere goes on from there), stops after ``--steps`` steps or
once ``<marker-dir>/finish`` exists, and writes ``start-<rank>-<pid>`` and ``done-<rank>-<pid>``
markers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from resiliency.ft import RankMonitorClient
from resiliency.goodput import get_recorder


@record  # the error file: the launcher's verdict names the exception
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker-dir", required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--report-s", type=float, default=1.0)
    parser.add_argument(
        "--crash-after-steps",
        type=int,
        default=None,
        help="exit 1 after this many steps of every run (the same root cause)",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        help="rank 0 raises ValueError at this step, in every run (a bad batch: no progress)",
    )
    parser.add_argument(
        "--gpu-error-at-step",
        type=int,
        default=None,
        help="a rank of a node started with SUPERVISOR_TEST_SLOW=1 raises a CUDA Xid error",
    )
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    markers = Path(args.marker_dir)
    (markers / f"start-{rank}-{os.getpid()}").touch()
    # The fault: a node started with SUPERVISOR_TEST_SLOW=1 turns slow once the test creates
    # <marker-dir>/inject-slow.
    slow_node = os.environ.get("SUPERVISOR_TEST_SLOW") == "1"
    inject = markers / "inject-slow"
    client = RankMonitorClient()
    client.init_workload_monitoring()
    rec = get_recorder()
    window_start, window_steps = time.monotonic(), 0
    # The "checkpoint": each rank's progress in the shared marker directory, so that a node
    # that takes over a rank (a spare) goes on from where the rank was.
    progress = markers / f"progress-{rank}"
    first = int(progress.read_text() or 0) if progress.exists() else 0
    finish = markers / "finish"  # the test ends training by creating it
    for step in range(first, args.steps):
        if finish.exists():
            break
        if slow_node and step == args.gpu_error_at_step:
            raise RuntimeError("CUDA error: an Xid 79 was reported: GPU has fallen off the bus")
        if rank == 0 and step == args.fail_at_step:
            raise ValueError(f"bad batch at step {step}: label 7 is out of range [0, 5)")
        client.start_section("step")
        slow = slow_node and inject.exists()
        time.sleep(args.step_s * (args.slow_factor if slow else 1.0))
        client.end_section("step")
        client.send_heartbeat()
        rec.step(step)
        progress.write_text(str(step + 1))
        if args.crash_after_steps is not None and step + 1 - first >= args.crash_after_steps:
            sys.exit(1)
        window_steps += 1
        elapsed = time.monotonic() - window_start
        if elapsed >= args.report_s:
            score = min(1.0, args.step_s * window_steps / elapsed)
            rec.emit(
                "straggler_detected",
                ranks=[rank] if score < 0.7 else [],
                scores={str(rank): {"individual": round(score, 3)}},
            )
            rec.flush()
            window_start, window_steps = time.monotonic(), 0
    rec.flush()
    client.shutdown_workload_monitoring()
    (markers / f"done-{rank}-{os.getpid()}").touch()


if __name__ == "__main__":
    main()
