"""The goodput benchmark: one seeded fault schedule against three setups of the same job.

    nox -s bench_goodput
    python benchmarks/bench_goodput.py --results benchmarks/results [--duration 600] [--seed 9]

A real CPU DDP job (2 nodes x 2 ranks on loopback, a small model with a fixed step time) runs
under ``resiliency-simulate``'s runner once per setup, for the same wall-clock length, with the
same fault plan, the same gloo timeout, the same step time and the same persistent checkpoint
cadence:

1. ``torchrun --max-restarts`` + Lightning with its standard ``ModelCheckpoint``;
2. ``ft-launcher`` + resiliency's callbacks: heartbeats with calculated timeouts (hang
   detection), asynchronous verified checkpoints in two tiers (node-local every
   ``--local-every`` steps with a replica on the other node, persistent every
   ``--persistent-every`` steps, as setup 1), the agreed emergency checkpoint on preemption,
   and workers forked from a fork server that imported torch and Lightning once per node
   (``--ft-preimport``).

3. ``inprocess``: setup 2's launcher with ``--ft-inprocess-respawn``, and the same model, data,
   step time and checkpoint cadences as a plain torch loop (``_goodput_inprocess_job.py``)
   inside ``resiliency.inprocess.Wrapper``: a SIGKILLed rank is respawned alone and healed
   from a live peer (``Healer``), the other processes keep running; a stopped rank, a
   preemption and a lost node take the launcher's full restart and a checkpoint load.

All write the same goodput ledger (setup 1 through a passive callback that only records), and
``resiliency.goodput.compute`` reads both. The simulator plays the scheduler: a node whose
launcher exits with a non-zero code (failed, preempted, lost) is started again after
``--restart-after`` seconds. Prints one side-by-side table; writes ``DIR/bench_goodput.json``
(each setup's ``name``, ``launcher`` and ``goodput_percent``, plus its breakdown and faults) and
``DIR/bench_goodput.png``.

The ideal step: ``productive`` counts kept steps at an ideal step time and ``slowdown`` what
they took beyond it. Four training processes on a 2-core machine do not reach the job's
``--step-time`` even without faults, so a fixed ideal charges the machine's own pace to
slowdown. First (``--calibrate`` seconds, default 120; 0: skip) the torchrun setup, plain
Lightning with nothing of ours, runs with no fault; the median of its step times (as
``resiliency-goodput report --reference-step-time auto`` takes it) is the ideal step of this
machine, used for both setups. The table shows both definitions: goodput against the measured
ideal (``goodput_percent``, the headline) and against the fixed ``--step-time``
(``goodput_percent_fixed``), with slowdown under each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from resiliency.goodput import CATEGORIES, Recorder, compute, read_ledger
from resiliency.simulator import (
    FaultPlan,
    Injection,
    JobRunner,
    RunnerOptions,
    outcomes,
    timeline_of,
)

HERE = Path(__file__).resolve().parent
JOB = HERE / "_goodput_job.py"
INPROCESS_JOB = HERE / "_goodput_inprocess_job.py"
SETUPS = {
    "torchrun": "torchrun --max-restarts + Lightning ModelCheckpoint (torch.save)",
    "toolkit": "ft-launcher --ft-preimport + resiliency callbacks (calculated heartbeat "
    "timeouts, async + emergency checkpoints)",
    "inprocess": "ft-launcher --ft-inprocess-respawn + inprocess.Wrapper/Healer (plain loop; "
    "a dead rank respawned alone and healed, full restarts load the same checkpoint tiers)",
}
# What the in-process job imports before it reaches the Wrapper: a rank respawned alone is
# forked from the server and runs the script from its first line (docs/inprocess.md).
INPROCESS_PREIMPORT = "torch,torch._dynamo,resiliency.inprocess,resiliency.ft"
FT_FLAGS = [
    "--monitor-interval",
    "0.5",
    "--ft-initial-rank-heartbeat-timeout",
    "120",
    "--ft-stack-dump-timeout",
    "1",
    "--ft-termination-grace-period",
    "2",
    # The launcher's own stop (a restart): SIGTERM, then SIGKILL after 1 s. A rank waiting in
    # a collective for a dead peer cannot run its SIGTERM handler anyway.
    "--workers-stop-timeout",
    "1",
    "--term-timeout",
    "30",
    "--no-gpu-health-check",
    # Workers of every restart forked from a server that imported these once per node.
    "--ft-preimport",
    "torch,lightning,resiliency.ptl",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command(
    setup: str, args: argparse.Namespace, ckpt: Path, ledger: Path, port: int
) -> list[str]:
    rdzv = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        str(args.nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"bench-{setup}",
        "--rdzv-conf",
        "join_timeout=300,last_call_timeout=2",
        "--max-restarts",
        "1000",
    ]
    job = [
        str(JOB),
        "--setup",
        setup,
        "--ckpt-dir",
        str(ckpt),
        "--step-time",
        str(args.step_time),
        # More steps than the run can reach: the dataset (and its sampler's index list, built
        # at every start) is sized from this.
        "--steps",
        str(int(2 * args.duration / args.step_time) + 100),
        "--persistent-every",
        str(args.persistent_every),
        "--gloo-timeout",
        str(args.gloo_timeout),
    ]
    if setup == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *rdzv, *job]
    flags = FT_FLAGS
    if setup == "inprocess":
        if not args.local_every:
            raise SystemExit("--setups inprocess needs --local-every > 0 (its local tier)")
        job[0] = str(INPROCESS_JOB)
        # Its Wrapper and process groups coordinate through the launchers' rendezvous store.
        job += ["--store", f"127.0.0.1:{port}", "--soft-timeout", str(args.soft_timeout)]
        flags = [*FT_FLAGS[:-1], INPROCESS_PREIMPORT, "--ft-inprocess-respawn"]
    if args.local_every:
        job += ["--local-dir", str(ckpt.parent / "local" / "node{node}")]
        job += ["--local-every", str(args.local_every)]
    return [
        sys.executable,
        "-m",
        "resiliency.launcher",
        *rdzv,
        *flags,
        "--ft-rank-heartbeat-timeout",
        str(args.heartbeat_timeout),
        "--ft-calculated-timeout-floor",
        str(args.timeout_floor),
        "--goodput-dir",
        str(ledger),
        *job,
    ]


def run_setup(
    setup: str,
    plan: FaultPlan,
    args: argparse.Namespace,
    work: Path,
    ideal_step_s: float | None = None,
) -> dict[str, Any]:
    """Run one setup under the plan; return its row of results.

    ``args`` holds ``main``'s options (``parser().parse_args([...])`` gives the defaults). The
    launcher's output goes to ``work/<setup>.log`` and the ledger to ``work/<setup>/ledger``.
    ``ideal_step_s``: the measured ideal step (see ``calibrate``); the headline goodput uses it,
    and the fixed ``args.step_time`` gives the second definition. None: the fixed one only.
    """
    ckpt, ledger = work / setup / "ckpt", work / setup / "ledger"
    ckpt.mkdir(parents=True)
    ledger.mkdir(parents=True)
    job_id = f"bench-{setup}-{os.getpid()}"
    env = {"RESILIENCY_JOB_ID": job_id, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if setup == "torchrun":
        # torch's own fix for restarting a gloo group under torchrun (FIELD_NOTES, #135712).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    scheduler = Recorder(ledger, job=job_id, node="scheduler")
    log_path = work / f"{setup}.log"
    print(f"[bench_goodput] {setup}: {len(plan)} faults over {args.duration:.0f} s; log {log_path}")
    with log_path.open("w") as log:
        runner = JobRunner(
            RunnerOptions(
                command=_command(setup, args, ckpt, ledger, _free_port()),
                nodes=2,
                node_start_delay_s=3.0,
                restart_nodes_after_s=args.restart_after,
                grace_s=30.0,
                slow_ratio=0.5,
                slow_duration_s=20.0,
                ckpt_dir=ckpt,
                local_ckpt_dir=str(ckpt.parent / "local" / "node{node}"),
                goodput_dir=ledger,
                env=env,
                stdout=log,
                faults_from_first_step=args.from_first_step,
            )
        )
        scheduler.emit("job_scheduled")
        scheduler.flush()

        def record(injection: Injection) -> None:
            scheduler.emit(
                "fault_injected", kind=injection.fault.kind, victim=injection.victim or "none"
            )

        injections = runner.run(plan, args.duration, record)
        scheduler.emit("job_ended", exit_code=0, reason=f"benchmark length {args.duration:.0f} s")
        scheduler.close()
    parsed = read_ledger([ledger])
    fixed = compute(parsed, reference_step_time=args.step_time)
    report = fixed if ideal_step_s is None else compute(parsed, reference_step_time=ideal_step_s)
    rows = outcomes(injections, timeline_of(parsed), runner.t0_wall)
    whole = report.whole
    return {
        "setup": setup,
        "name": SETUPS[setup],
        "launcher": "torchrun" if setup == "torchrun" else "ft-launcher",
        "goodput_percent": round(100.0 * whole.goodput, 2),
        "ideal_step_s": round(ideal_step_s or args.step_time, 4),
        "ideal_source": "measured" if ideal_step_s is not None else "fixed",
        "goodput_percent_fixed": round(100.0 * fixed.whole.goodput, 2),
        "slowdown_fixed_s": round(fixed.whole.seconds["slowdown"], 1),
        "total_s": round(whole.total, 1),
        "seconds": {k: round(v, 1) for k, v in whole.seconds.items()},
        "hang_detection_s": round(whole.hang_detection, 1),
        "final_step": report.final_step,
        "faults": [
            {
                "kind": r.kind,
                "victim": r.victim,
                "injected_s": r.injected_s,
                "detected_s": r.detected_s,
                "recovered_s": r.recovered_s,
                "steps_lost": r.steps_lost,
                "note": r.note,
            }
            for r in rows
        ],
        "warnings": report.warnings[:20],
    }


def calibrate(args: argparse.Namespace, work: Path) -> float:
    """The ideal step of this machine: the median step of a fault-free torchrun run."""
    quiet = argparse.Namespace(**{**vars(args), "duration": args.calibrate})
    empty = FaultPlan(seed=0, mtbf=float("inf"), keep_alive=0.0, faults=())
    run_setup("torchrun", empty, quiet, work / "calibration")
    report = compute(read_ledger([work / "calibration" / "torchrun" / "ledger"]), "auto")
    if report.ideal_step_time_s is None:
        raise RuntimeError(
            f"calibration: the fault-free run recorded no step in {args.calibrate:.0f} s; "
            f"see {work / 'calibration' / 'torchrun.log'}"
        )
    return report.ideal_step_time_s


def table(results: list[dict[str, Any]]) -> str:
    names = [r["setup"] for r in results]
    lines = [f"{'':28}" + "".join(f"{n:>16}" for n in names)]
    source = results[0]["ideal_source"] if results else "fixed"
    ideal = results[0]["ideal_step_s"] if results else 0.0
    lines.append(
        f"{f'goodput (ideal {ideal:.3f} s)':28}"
        + "".join(f"{r['goodput_percent']:>15.1f}%" for r in results)
        + ("  measured fault-free" if source == "measured" else "  fixed --step-time")
    )
    for cat in CATEGORIES:
        cells = "".join(
            f"{r['seconds'][cat]:>10.1f} s {100 * r['seconds'][cat] / r['total_s']:>3.0f}%"
            for r in results
        )
        lines.append(f"{cat:28}{cells}")
    lines.append(
        f"{'  of which hang detection':28}"
        + "".join(f"{r['hang_detection_s']:>14.1f} s" for r in results)
    )
    lines.append(f"{'total':28}" + "".join(f"{r['total_s']:>14.1f} s" for r in results))
    lines.append(f"{'final step':28}" + "".join(f"{r['final_step']!s:>16}" for r in results))
    if source == "measured":
        lines.append("with the fixed --step-time as the ideal:")
        lines.append(
            f"{'  goodput':28}" + "".join(f"{r['goodput_percent_fixed']:>15.1f}%" for r in results)
        )
        lines.append(
            f"{'  slowdown':28}" + "".join(f"{r['slowdown_fixed_s']:>14.1f} s" for r in results)
        )
    return "\n".join(lines)


def plot_shares(results: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415 - optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("[bench_goodput] matplotlib missing: no PNG")
        return
    fig, ax = plt.subplots(figsize=(8, 3.2))
    colors = dict(zip(CATEGORIES, plt.get_cmap("tab10").colors, strict=False))
    for y, r in enumerate(results):
        left = 0.0
        for cat in CATEGORIES:
            share = 100 * r["seconds"][cat] / r["total_s"]
            ax.barh(y, share, left=left, color=colors[cat], label=cat if y == 0 else None)
            left += share
    ax.set_yticks(
        range(len(results)), [f"{r['setup']}\n{r['goodput_percent']:.0f} %" for r in results]
    )
    ax.set_xlabel("share of wall time (%)")
    ax.set_xlim(0, 100)
    ax.legend(ncol=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.set_title("Goodput under the same seeded faults")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    """The benchmark's options; ``examples/demo.py`` runs the same setups with its own."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--duration", type=float, default=600.0, help="wall seconds per setup")
    p.add_argument("--seed", type=int, default=9, help="9 draws every default kind")
    p.add_argument("--mtbf", type=float, help="default: duration / 12")
    p.add_argument("--keep-alive", type=float, default=25.0)
    p.add_argument("--faults", default="kill,stop,slow,preempt,node_loss")
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--persistent-every", type=int, default=50)
    p.add_argument(
        "--local-every",
        type=int,
        default=10,
        help="toolkit: node-local checkpoint (replicated to the other node) every N steps; 0: none",
    )
    p.add_argument("--gloo-timeout", type=float, default=60.0)
    p.add_argument("--restart-after", type=float, default=5.0)
    p.add_argument("--setups", default="torchrun,toolkit,inprocess")
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=10.0,
        help="toolkit: the heartbeat timeout until calculated ones replace it",
    )
    p.add_argument(
        "--timeout-floor",
        type=float,
        default=0.0,
        help="toolkit: --ft-calculated-timeout-floor; 0 (no floor) as in the documented runs: "
        "this job's observed gaps include its saves, loads and restarts",
    )
    p.add_argument(
        "--from-first-step",
        action="store_true",
        help="time the faults from the job's first training step, not from the launchers' start",
    )
    p.add_argument(
        "--calibrate",
        type=float,
        default=120.0,
        help="seconds of a fault-free torchrun run whose median step is the ideal step of both "
        "setups (0: use the fixed --step-time)",
    )
    p.add_argument(
        "--soft-timeout",
        type=float,
        default=30.0,
        help="inprocess: the Wrapper's soft timeout (its hard timeout is 15 s more)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p


def main() -> int:
    args = parser().parse_args()
    mtbf = args.mtbf or args.duration / 12
    plan = FaultPlan.from_seed(
        args.seed,
        faults=args.faults.split(","),
        mtbf=mtbf,
        keep_alive=args.keep_alive,
        duration=args.duration - 20,
    )
    print(f"[bench_goodput] plan (seed {args.seed}, MTBF {mtbf:.0f} s): {len(plan)} faults")
    for fault in plan.faults:
        print(f"  {fault.describe()}")
    work = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    results = []
    try:
        ideal = None
        if args.calibrate > 0:
            ideal = calibrate(args, work)
            print(
                f"[bench_goodput] ideal step measured fault-free: {ideal:.3f} s "
                f"(the job asks for {args.step_time} s)"
            )
        for setup in args.setups.split(","):
            t0 = time.monotonic()
            results.append(run_setup(setup, plan, args, work, ideal))
            print(f"[bench_goodput] {setup}: {time.monotonic() - t0:.0f} s wall")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    for r in results:
        print(f"\n{r['setup']}: faults")
        for i, f in enumerate(r["faults"], 1):
            print(
                f"  #{i} {f['kind']:<10} {f['victim']:<8} injected {f['injected_s']}  "
                f"detected {f['detected_s']}  recovered {f['recovered_s']}  lost {f['steps_lost']}"
            )
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "bench_goodput.json"
    out.write_text(
        json.dumps(
            {
                "seed": args.seed,
                "mtbf_s": mtbf,
                "duration_s": args.duration,
                "step_time_s": args.step_time,
                "ideal_step_s": ideal,
                "faults_planned": [f.kind for f in plan.faults],
                "setups": results,
            },
            indent=2,
        )
    )
    plot_shares(results, args.results / "bench_goodput.png")
    print(f"[bench_goodput] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
