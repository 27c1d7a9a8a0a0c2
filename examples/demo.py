"""What the toolkit buys a training job: the same faults under torchrun and under ft-launcher.

    nox -s demo
    python examples/demo.py [--seed 5] [--duration 50] [--results DIR] [--keep]

A small real DDP job (Lightning over gloo on CPU, 2 nodes x 1 rank on loopback, a fixed step
time: the goodput benchmark's job, ``benchmarks/_goodput_job.py``) runs under two setups at once,
for the same wall time, each under its own ``resiliency-simulate`` runner, which plays the faults
and the scheduler (a node whose launcher exits non-zero is started again). Both share the
machine, so neither has it to itself (``nox -s bench_goodput`` runs them one after the other, for
longer). One fault schedule, its victims drawn from ``--seed``, is played against both setups,
timed from each job's first training step:

- a crash: ``SIGKILL`` to one rank (as the kernel's OOM killer does);
- a hang: ``SIGSTOP`` to one rank, a hang no handler inside the rank can see;
- the preemption of one node: ``SIGTERM`` to its launcher, ``SIGKILL`` after a grace period,
  and the node back after a short wait, as a scheduler would do.

The setups are the goodput benchmark's (``benchmarks/bench_goodput.py``):

1. ``torchrun --max-restarts`` with Lightning's periodic ``ModelCheckpoint``: what users run
   today. Only gloo's collective timeout ends the hang.
2. ``ft-launcher`` with the toolkit: heartbeats watched by a monitor per rank (hang detection,
   the culprit named), asynchronous node-local checkpoints replicated to the other node, the
   agreed emergency checkpoint on preemption, workers forked from a pre-imported server, and
   the goodput ledger the launcher and callbacks write by themselves.

Both record the same ledger format, so one calculator (``resiliency.goodput``) scores both. It
prints each fault's detection and recovery, the hang verdict, both goodputs side by side with
their badput breakdown, and writes the PNGs (the toolkit's goodput timeline, the two setups'
shares of wall time) into ``--results``.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from resiliency.simulator import Fault, FaultPlan

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))
import bench_goodput  # noqa: E402 - the benchmark's setups, run here with the demo's options

#: The schedule's kinds, in order, with their time after the first training step (seconds).
SCHEDULE = (("kill", 5.0), ("stop", 18.0), ("preempt", 32.0))
WHAT = {"kill": "crash (SIGKILL)", "preempt": "preemption", "stop": "hang (SIGSTOP)"}


def plan_for(seed: int) -> FaultPlan:
    """The demo's schedule: fixed kinds and times, victims drawn from ``seed``."""
    rng = random.Random(seed)
    faults = tuple(
        Fault(at_s=at, kind=kind, victim=rng.randrange(2**31), seed=rng.randrange(2**31))
        for kind, at in SCHEDULE
    )
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(SCHEDULE)]
    return FaultPlan(seed=seed, mtbf=sum(gaps) / len(gaps), keep_alive=min(gaps), faults=faults)


def _cell(value: float | None) -> str:
    return "never" if value is None else f"{value:5.1f} s"


def _print_faults(result: dict[str, Any]) -> None:
    print(f"\n{result['launcher']}: {result['name']}")
    for f in result["faults"]:
        detected, recovered = f["detected_s"], f["recovered_s"]
        took = "" if detected is None or recovered is None else f" ({recovered - detected:.1f} s)"
        lost = "" if f["steps_lost"] is None else f", {f['steps_lost']} steps redone"
        what, victim = WHAT.get(f["kind"], f["kind"]), f["victim"] or "-"
        print(
            f"  {what:<17} {victim:<7} at {_cell(f['injected_s'])}   detected {_cell(detected)}"
            f"   training again {_cell(recovered)}{took}{lost}"
        )


def _hang_report(log: Path, window_s: float = 10.0) -> list[str]:
    """The launcher's own words on the first hang: the ranks its monitors caught, its verdicts
    (each node's, over its own ranks, and the job-wide one over every node's).

    Every node's lines from the first ``hung`` line on, for ``window_s`` seconds.
    """
    line_re = re.compile(r"^\[[^]]+\] (?P<stamp>\S+ \S+) [A-Z]+ (?P<text>.*)$")
    said: list[str] = []
    first: datetime | None = None
    for line in log.read_text(errors="replace").splitlines():
        match = line_re.match(line)
        if match is None:
            continue
        text = match["text"]
        if not (" hung: " in text and "[timer:" in text) and "hang verdict:" not in text:
            continue
        stamp = datetime.strptime(match["stamp"], "%Y-%m-%d %H:%M:%S,%f")
        first = first or stamp
        if (stamp - first).total_seconds() > window_s:
            break
        if text not in said:  # every node logs the job-wide verdict: once is enough here
            said.append(text)
    return said


def _timeline(ledger: Path, step_time: float, png: Path) -> bool:
    """Write the goodput timeline with the report CLI a user runs on their own ledger."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "resiliency.goodput",
            "report",
            str(ledger),
            "--reference-step-time",
            str(step_time),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(f"goodput timeline: not written ({proc.stderr.strip() or proc.stdout.strip()})")
    return proc.returncode == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--duration", type=float, default=100.0, help="wall seconds of the demo")
    p.add_argument("--results", type=Path, default=Path("demo-results"))
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, ledgers)")
    ours = p.parse_args()
    # The benchmark's setups with the demo's size: 1 rank per node, a short hang timeout (the
    # toolkit's until it calculates its own, never below 5 s), a gloo timeout that ends
    # torchrun's hang within the demo.
    args = bench_goodput.parser().parse_args(
        [
            *("--duration", str(ours.duration)),
            *("--nproc-per-node", "1"),
            *("--heartbeat-timeout", "3"),
            *("--timeout-floor", "5"),
            *("--gloo-timeout", "15"),
            *("--persistent-every", "25"),
            *("--local-every", "5"),
            *("--restart-after", "2"),
            "--from-first-step",
        ]
    )
    plan = plan_for(ours.seed)
    print(
        f"demo: 2 nodes x 1 rank of DDP training, both setups at once for "
        f"{ours.duration:.0f} s; seed {ours.seed}: "
        + ", ".join(f"{WHAT[f.kind]} at {f.at_s:.0f} s" for f in plan.faults),
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="resiliency-demo-"))
    start = time.monotonic()
    try:
        # One thread per setup: each waits on its own runner (processes, not Python work).
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = [
                pool.submit(bench_goodput.run_setup, setup, plan, args, work)
                for setup in ("torchrun", "toolkit")
            ]
            results = [run.result() for run in runs]
        for result in results:
            _print_faults(result)
        print("\nft-launcher on the hang (its log):")
        for line in _hang_report(work / "toolkit.log") or ["no hang reported (--keep: the log)"]:
            print(f"  {line}")
        print()
        print(bench_goodput.table(results))
        by = {r["launcher"]: r["goodput_percent"] for r in results}
        print(
            f"\ngoodput  torchrun: {by['torchrun']:.1f} %   ft-launcher: {by['ft-launcher']:.1f} %"
            f"   (same faults, {time.monotonic() - start:.0f} s for both)"
        )
        ours.results.mkdir(parents=True, exist_ok=True)
        shares = ours.results / "demo_goodput.png"
        bench_goodput.plot_shares(results, shares)
        timeline = ours.results / "demo_timeline_ft_launcher.png"
        if _timeline(work / "toolkit" / "ledger", args.step_time, timeline):
            print(f"goodput timeline (ft-launcher): {timeline.resolve()}")
        print(f"shares of wall time, both setups: {shares.resolve()}")
        ok = by["ft-launcher"] > by["torchrun"]
    finally:
        if ours.keep:
            print(f"work directory (logs, ledgers, checkpoints): {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("demo OK" if ok else "demo FAILED: ft-launcher's goodput is not the higher")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
