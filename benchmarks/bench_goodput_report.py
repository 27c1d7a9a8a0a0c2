"""Speed of resiliency-goodput: ``report`` on a generated ledger, and the writer's ``step()``.

* ``report``: a ledger of ``--events`` events (default 1,000,000: a long job with every step
  recorded, checkpoint saves every 500 steps, a crash and a hang with restarts, over two node
  files) is generated, then ``resiliency-goodput report`` runs on it as a subprocess (what a
  user types, interpreter start included), ``--repeats`` times. Target: <= 3 s of CPU (user +
  system, of the report and any process it starts); the wall time is shown too, but on a
  shared machine it also counts the neighbours' load.
* ``step()``: the cost per call on the calling (training) thread of an enabled rank-0
  recorder, timed in batches, median over ``--repeats`` repeats. Target: <= 2 us.

    python benchmarks/bench_goodput_report.py [--events 1000000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from resiliency.goodput import Recorder

REPORT_TARGET_S = 3.0
STEP_TARGET_US = 2.0
T0 = 1_795_392_000.0  # 2026-11-23T00:00:00Z


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds")


def generate(directory: Path, events: int) -> int:
    """Write a ledger of about ``events`` events into ``directory``; return the count written."""
    launcher: list[str] = []
    ranks: list[str] = []

    def add(out: list[str], t: float, event: str, attempt: int, who: Any, **fields: Any) -> None:
        record = {
            "schema": 1,
            "job": "bench",
            "event": event,
            "time": _iso(t),
            "mono": round(t - T0, 6),
            "node": "0",
            "rank": who,
            "attempt": attempt,
            **fields,
        }
        out.append(json.dumps(record, separators=(",", ":")))

    t = T0
    add(launcher, t, "job_started", 0, None)
    step, attempt = 0, 0
    failures = {events // 3: "crash", 2 * events // 3: "hang"}
    add(launcher, t, "cycle_started", 0, None, cycle=0)
    t += 30.0
    written = 2
    while written < events - 10:
        step += 1
        t += 0.5 if step % 97 else 0.9  # a slow step now and then
        add(ranks, t, "step", attempt, 0, step=step)
        written += 1
        if step % 500 == 0:
            add(
                ranks,
                t + 0.2,
                "checkpoint_saved",
                attempt,
                0,
                step=step,
                tier="persistent",
                bytes=1 << 30,
                blocked_s=0.2,
                total_s=3.0,
            )
            t += 0.2
            written += 1
        cause = failures.pop(written, None) if written in failures else None
        if cause is not None:
            if cause == "hang":
                t += 60.0
                add(
                    launcher,
                    t,
                    "hang_detected",
                    attempt,
                    None,
                    rank=1,
                    timer="heartbeat",
                    latency_s=0.4,
                    timeout_s=59.6,
                )
            add(
                launcher,
                t + 0.5,
                "cycle_ended",
                attempt,
                None,
                cycle=attempt,
                cause=cause,
                timer=None,
                ranks=[1],
            )
            attempt += 1
            t += 20.0
            add(launcher, t, "cycle_started", attempt, None, cycle=attempt)
            t += 15.0
            step -= step % 500
            add(
                ranks,
                t,
                "checkpoint_loaded",
                attempt,
                0,
                step=step,
                tier="persistent",
                bytes=1 << 30,
                duration_s=10.0,
            )
            written += 3
    add(
        launcher,
        t + 1.0,
        "cycle_ended",
        attempt,
        None,
        cycle=attempt,
        cause="success",
        timer=None,
        ranks=[],
    )
    add(launcher, t + 2.0, "job_ended", attempt, None, exit_code=0, reason="success")
    (directory / "bench.node0.jsonl").write_text("\n".join(ranks) + "\n")
    (directory / "bench.launcher.jsonl").write_text("\n".join(launcher) + "\n")
    return len(ranks) + len(launcher)


def time_report(directory: Path, repeats: int) -> tuple[list[float], list[float], dict[str, Any]]:
    """Run ``resiliency-goodput report --json`` on the ledger.

    Returns the wall seconds and the CPU seconds (user + system, from the child's resource
    usage: on a shared machine the wall time also counts the neighbours' load) of each run.
    """
    runs, cpu_runs = [], []
    data: dict[str, Any] = {}
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "resiliency.goodput", "report", str(directory), "--json"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
        runs.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_runs.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        data = json.loads(out)
    return runs, cpu_runs, data


def time_step(repeats: int, calls: int = 200_000, batch: int = 1000) -> list[float]:
    """Per-call microseconds of an enabled rank-0 ``Recorder.step`` (median of its batches)."""
    directory = Path(tempfile.mkdtemp(prefix="goodput-bench-"))
    try:
        recorder = Recorder(directory, job="bench", rank=0)
        clock = time.perf_counter_ns
        n = 0
        runs = []
        for _ in range(repeats + 1):  # the first is a warm-up
            per_batch = []
            for _ in range(calls // batch):
                start = clock()
                for _ in range(batch):
                    n += 1
                    recorder.step(n)
                per_batch.append((clock() - start) / batch / 1000.0)
            runs.append(statistics.median(per_batch))
        recorder.close()
        return runs[1:]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="ledger events")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (median is reported)")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)

    directory = Path(tempfile.mkdtemp(prefix="goodput-ledger-"))
    try:
        start = time.perf_counter()
        written = generate(directory, args.events)
        generated_s = time.perf_counter() - start
        size = sum(p.stat().st_size for p in directory.iterdir())
        report_runs, cpu_runs, data = time_report(directory, args.repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    step_runs = time_step(args.repeats)

    report_s = statistics.median(report_runs)
    cpu_s = statistics.median(cpu_runs)
    step_us = statistics.median(step_runs)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"resiliency-goodput: ledger of {written:,} events ({size / 1e6:.0f} MB, "
        f"generated in {generated_s:.1f} s); goodput {100 * data['goodput']:.1f} %"
    )
    print(f"{'figure':<44}{'median':>10}  {'target':<8}{'runs'}")
    rows: list[tuple[str, float, list[float], float | None]] = [
        ("report, CPU of all its processes (s)", cpu_s, cpu_runs, REPORT_TARGET_S),
        # Informational: on a shared machine the wall time also counts the neighbours' load.
        ("report on the ledger (subprocess, wall s)", report_s, report_runs, None),
        ("Recorder.step() per call, rank 0 (us)", step_us, step_runs, STEP_TARGET_US),
    ]
    for name, median, runs, target in rows:
        verdict = "" if target is None else ("ok" if median <= target else "OVER")
        bound = "" if target is None else f"<= {target:g}"
        spread = ", ".join(f"{r:.3g}" for r in runs)
        print(f"{name:<44}{median:>10.3f}  {bound:<6}{verdict:<4}  {spread}")
    if args.json is not None:
        payload = {
            "events": written,
            "ledger_bytes": size,
            "report_runs_s": report_runs,
            "report_cpu_runs_s": cpu_runs,
            "load_average_1min": os.getloadavg()[0],
            "report_target_s": REPORT_TARGET_S,
            "report_target_of": "cpu",
            "step_runs_us": step_runs,
            "step_target_us": STEP_TARGET_US,
            "goodput": data["goodput"],
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0  # a figure over its target is reported, not turned into a failure


if __name__ == "__main__":
    sys.exit(main())
