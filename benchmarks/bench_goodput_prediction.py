"""Is ``resiliency-goodput advise``'s prediction right? Predict one goodput run from another.

    python benchmarks/bench_goodput_prediction.py --results benchmarks/results \\
        [--duration 600] [--seed-a 9 --mtbf-a 50 --every-a 50] [--seed-b 4 --mtbf-b 80 --every-b 20]

Run A is the goodput benchmark (``bench_goodput.run_setup``: the same real CPU DDP job, both
setups, torchrun + Lightning and ft-launcher + resiliency) with one fault seed, MTBF and save
interval. From each setup's ledger of run A alone, ``advise`` measures what the model needs: the
MTBF that the planned faults turned into, the blocking cost of a save per tier, the restore and
restart costs, the step efficiency, and the fixed costs (start-up, idle) of the run. Run B then
changes the seed, the MTBF and the save interval (``--persistent-every`` and, for the toolkit, its
``--local-every`` in the same ratio), and the prediction for B, made before B runs, is:

    fixed = (start-up + idle of A) / duration
    M_B   = MTBF measured in A x (failures planned for A / failures planned for B)
    other = product over the other tiers t of (1 - d_t / (interval_t of B + d_t))
    goodput_B = (1 - fixed) x step efficiency x other x Daly(interval_B, d, restart + restore, M_B)

with Daly's model as in ``resiliency.goodput.advice`` for the tier saved most often (restarts
restore from it). The failures planned are the seeded plan's faults that end an attempt (every
kind but ``slow``): both plans are known before either run, and with a dozen faults in a run the
seed's draw, not the ``--mtbf`` given, sets how many failures a run sees (seed 4 at MTBF 80 s
draws 2 failures and 5 slow ranks in 600 s: 300 s between failures, not 80). Then B runs, and
the table puts predicted and measured side by side. ``--a-from DIR`` takes run A from a run
kept with ``--keep`` (its folder ``DIR/a``, run with the same A options) instead of running it
again, ``--b-from DIR`` the same for run B; with both, nothing runs.

Each run is ``--duration`` seconds per setup (two setups, two runs: 4 x duration, ~40 min at
the default). It is not part of ``run.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_goodput  # a sibling script: python puts this directory on the path

from resiliency.goodput import advise, compute, predicted_goodput, read_ledger
from resiliency.simulator import FaultPlan

SETUPS = ("torchrun", "toolkit")
#: The simulator's kinds in the benchmark's plans that do not end an attempt: a slowed rank goes on.
NOT_FAILURES = frozenset({"slow"})


def _plan(seed: int, mtbf: float, options: argparse.Namespace) -> FaultPlan:
    """The seeded fault plan of one run, as ``bench_goodput`` draws it."""
    args = bench_goodput.parser().parse_args(["--duration", str(options.duration)])
    return FaultPlan.from_seed(
        seed,
        faults=args.faults.split(","),
        mtbf=mtbf,
        keep_alive=args.keep_alive,
        duration=args.duration - 20,
    )


def planned_failures(plan: FaultPlan) -> int:
    """How many of the plan's faults end an attempt (every kind but a slowed rank)."""
    return sum(fault.kind not in NOT_FAILURES for fault in plan.faults)


def _run(
    seed: int, mtbf: float, every: int, local_every: int, options: argparse.Namespace, work: Path
) -> dict[str, Path]:
    """One goodput benchmark run of both setups; the ledger directory of each."""
    args = bench_goodput.parser().parse_args(
        [
            "--duration",
            str(options.duration),
            "--seed",
            str(seed),
            "--mtbf",
            str(mtbf),
            "--persistent-every",
            str(every),
            "--local-every",
            str(local_every),
            "--step-time",
            str(options.step_time),
        ]
    )
    plan = _plan(seed, mtbf, options)
    for setup in SETUPS:
        bench_goodput.run_setup(setup, plan, args, work)
    return _ledgers(work)


def _ledgers(work: Path) -> dict[str, Path]:
    """The ledger directory of each setup of one run."""
    return {setup: work / setup / "ledger" for setup in SETUPS}


def predict(
    ledger_dir: Path, step_time: float, failure_ratio: float, every_ratio: float, duration: float
) -> dict[str, Any]:
    """The goodput of run B predicted from run A's ledger (see the module docstring).

    ``failure_ratio`` is B's planned failures over A's (0 when B plans none), ``every_ratio`` B's
    save interval over A's.
    """
    ledger = read_ledger([ledger_dir])
    report = compute(ledger, step_time)
    advice = advise(ledger, step_time, report)
    tier = next((t for t in advice.tiers if t.tier == advice.primary), None)
    if tier is None or tier.interval_s is None or advice.mtbf_s is None:
        return {"predicted": None, "why": "run A has no failure or no two saves of a tier"}
    fixed = (report.whole.seconds["startup"] + report.whole.seconds["idle"]) / duration
    restart = (advice.restart_s or 0.0) + (tier.restore_s or 0.0)
    interval_b = tier.interval_s * every_ratio
    # The other tiers' saves block too, each a share d / (interval + d) of the time.
    other = 1.0
    for t in advice.tiers:
        if t is not tier and t.interval_s is not None:
            other *= 1.0 - t.save_blocked_s / (t.interval_s * every_ratio + t.save_blocked_s)
    scale = max(1.0 - fixed, 0.0) * advice.step_efficiency * other

    def goodput_at(mtbf_a: float | None) -> float | None:
        if mtbf_a is None:
            return None
        mtbf_b = mtbf_a / failure_ratio if failure_ratio > 0 else math.inf
        if math.isinf(mtbf_b):
            return scale * interval_b / (interval_b + tier.save_blocked_s)
        return scale * predicted_goodput(interval_b, tier.save_blocked_s, restart, mtbf_b)

    mtbf_b = advice.mtbf_s / failure_ratio if failure_ratio > 0 else math.inf
    return {
        "predicted": goodput_at(advice.mtbf_s),
        # A's MTBF rests on a handful of failures: its 90 % confidence range, carried through
        "predicted_low": goodput_at(advice.mtbf_low_s),
        "predicted_high": goodput_at(advice.mtbf_high_s),
        "tier": tier.tier,
        "mtbf_a_s": advice.mtbf_s,
        "failures_a": advice.failures,
        "mtbf_b_s": mtbf_b if math.isfinite(mtbf_b) else None,
        "interval_b_s": interval_b,
        "save_blocked_s": tier.save_blocked_s,
        "other_tiers_share": other,
        "restart_s": restart,
        "step_efficiency": advice.step_efficiency,
        "fixed_share": fixed,
        "goodput_a": report.whole.goodput,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--duration", type=float, default=600.0, help="wall seconds per setup and run")
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--seed-a", type=int, default=9)
    p.add_argument("--mtbf-a", type=float, default=50.0)
    p.add_argument("--every-a", type=int, default=50, help="run A: persistent save every N")
    p.add_argument("--local-every-a", type=int, default=10, help="run A, toolkit: local every N")
    p.add_argument("--seed-b", type=int, default=4)
    p.add_argument("--mtbf-b", type=float, default=80.0)
    p.add_argument("--every-b", type=int, default=20, help="run B: persistent save every N")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--a-from", type=Path, help="run A's ledgers from DIR/a (kept with --keep)")
    p.add_argument("--b-from", type=Path, help="run B's ledgers from DIR/b (kept with --keep)")
    return p


def main() -> int:
    options = parser().parse_args()
    local_b = max(round(options.local_every_a * options.every_b / options.every_a), 1)
    planned_a = planned_failures(_plan(options.seed_a, options.mtbf_a, options))
    planned_b = planned_failures(_plan(options.seed_b, options.mtbf_b, options))
    print(f"[bench_goodput_prediction] failures planned: A {planned_a}, B {planned_b}")
    work = Path(tempfile.mkdtemp(prefix="bench-goodput-prediction-"))
    rows = []
    try:
        if options.a_from:
            a = _ledgers(options.a_from / "a")
        else:
            a = _run(
                options.seed_a,
                options.mtbf_a,
                options.every_a,
                options.local_every_a,
                options,
                work / "a",
            )
        predictions = {
            setup: predict(
                a[setup],
                options.step_time,
                planned_b / max(planned_a, 1),
                options.every_b / options.every_a,
                options.duration,
            )
            for setup in SETUPS
        }
        for setup, prediction in predictions.items():  # on record before B runs
            print(f"[bench_goodput_prediction] {setup}: predicted for B {prediction['predicted']}")
        if options.b_from:
            b = _ledgers(options.b_from / "b")
        else:
            b = _run(options.seed_b, options.mtbf_b, options.every_b, local_b, options, work / "b")
        for setup in SETUPS:
            measured = compute(read_ledger([b[setup]]), options.step_time).whole.goodput
            rows.append({"setup": setup, **predictions[setup], "measured": measured})
    finally:
        if options.keep:
            print(f"[bench_goodput_prediction] kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'setup':<10}{'goodput A':>11}{'predicted B':>13}{'90 % range':>15}"
        f"{'measured B':>12}{'error':>8}"
    )
    for row in rows:
        predicted = row["predicted"]
        error = "-" if predicted is None else f"{100 * (predicted - row['measured']):+.1f}"
        shown = "-" if predicted is None else f"{100 * predicted:.1f} %"
        low, high = row.get("predicted_low"), row.get("predicted_high")
        span = "-" if low is None or high is None else f"{100 * low:.0f}-{100 * high:.0f} %"
        print(
            f"{row['setup']:<10}{100 * row.get('goodput_a', 0.0):>9.1f} %{shown:>13}{span:>15}"
            f"{100 * row['measured']:>10.1f} %{error:>8}"
        )
    options.results.mkdir(parents=True, exist_ok=True)
    out = options.results / "bench_goodput_prediction.json"
    out.write_text(
        json.dumps(
            {
                "options": vars(options) | {"results": None, "a_from": None, "b_from": None},
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"[bench_goodput_prediction] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
