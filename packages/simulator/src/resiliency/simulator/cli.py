"""``resiliency-simulate``: run a job under a seeded fault schedule and say what each fault did.

    resiliency-simulate --seed 7 --mtbf 60 --faults kill,hang,slow,preempt --duration 600 \\
        --goodput-dir /shared/ledger -- ft-launcher --nproc-per-node 2 train.py
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from resiliency.goodput import JOB_ID_ENV, Recorder, read_ledger
from resiliency.simulator.errors import SimulatorError
from resiliency.simulator.outcome import format_table, outcomes, timeline_of
from resiliency.simulator.plan import FAULT_KINDS, FaultPlan
from resiliency.simulator.runner import Injection, JobRunner, RunnerOptions

__all__ = ["build_parser", "main"]

logger = logging.getLogger("resiliency.simulator")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``resiliency-simulate``."""
    p = argparse.ArgumentParser(
        prog="resiliency-simulate",
        description="Inject a seeded schedule of faults into a real job, from outside it.",
        epilog="Everything after -- is the job's launcher command; {node} in it becomes the "
        "node index when --nodes > 1.",
    )
    p.add_argument("--seed", type=int, required=True, help="same seed, same schedule")
    p.add_argument("--mtbf", type=float, default=60.0, help="mean seconds between faults")
    p.add_argument(
        "--faults",
        default="kill",
        help=f"comma-separated kinds to draw from: {','.join(FAULT_KINDS)}",
    )
    p.add_argument("--duration", type=float, help="stop the job after this many seconds")
    p.add_argument("--count", type=int, help="inject at most this many faults")
    p.add_argument(
        "--keep-alive",
        type=float,
        default=0.0,
        help="minimum quiet seconds before the first fault and between two faults",
    )
    p.add_argument("--nodes", type=int, default=1, help="copies of the command to start")
    p.add_argument("--node-start-delay", type=float, default=3.0)
    p.add_argument(
        "--restart-nodes-after",
        type=float,
        help="start a preempted or lost node again after this many seconds (a scheduler)",
    )
    p.add_argument("--grace", type=float, default=10.0, help="SIGTERM -> SIGKILL for preempt")
    p.add_argument("--slow-ratio", type=float, default=0.5)
    p.add_argument("--slow-duration", type=float, default=10.0)
    p.add_argument("--ckpt-dir", type=Path, help="for torn_checkpoint and disk_full")
    p.add_argument(
        "--ckpt-tmpfs",
        metavar="SIZE",
        help="mount a tmpfs of SIZE (e.g. 64m) on --ckpt-dir for the run (root), for disk_full",
    )
    p.add_argument("--local-ckpt-dir", help="a node's local checkpoint dir ({node}), node_loss")
    p.add_argument("--disk-full-hold", type=float, default=10.0)
    p.add_argument("--goodput-dir", type=Path, help="the job's ledger dir (default: a temp dir)")
    p.add_argument("--job-id", help="the job id in the ledger (default sim-<seed>)")
    p.add_argument(
        "--from-first-step",
        action="store_true",
        help="time the faults from the job's first training step (its first step in the "
        "ledger, waited for up to 60 s) instead of from its start; --duration still counts "
        "from the start",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- launcher command ...")
    return p


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise SimulatorError(
            f"cannot mount a {size} tmpfs on {path} ({exc}; {detail.decode().strip()}): "
            "--ckpt-tmpfs needs root; run as root or leave out disk_full"
        ) from exc


def _unmount(path: Path) -> None:
    result = subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)
    if result.returncode:
        logger.warning("could not unmount %s: %s", path, result.stderr.decode().strip())


def main(argv: list[str] | None = None) -> int:
    """Run the simulator; return the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="[resiliency-simulate] %(levelname)s %(message)s",
    )
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    missing = None
    if not command:
        missing = "give the job's launcher command after --"
    elif args.duration is None and args.count is None:
        missing = "give --duration or --count"
    if missing is not None:
        print(f"resiliency-simulate: {missing}", file=sys.stderr)
        return 2
    try:
        plan = FaultPlan.from_seed(
            args.seed,
            faults=[k.strip() for k in args.faults.split(",") if k.strip()],
            mtbf=args.mtbf,
            keep_alive=args.keep_alive,
            duration=args.duration,
            count=args.count,
        )
    except SimulatorError as exc:
        print(f"resiliency-simulate: {exc}", file=sys.stderr)
        return 2
    goodput_dir = args.goodput_dir or Path(tempfile.mkdtemp(prefix="resiliency-sim-"))
    goodput_dir.mkdir(parents=True, exist_ok=True)
    job = args.job_id or f"sim-{args.seed}"
    print(f"plan (seed {args.seed}, {len(plan)} fault(s)):", file=sys.stderr)
    for fault in plan.faults:
        print(f"  {fault.describe()}", file=sys.stderr)
    if args.ckpt_tmpfs:
        if args.ckpt_dir is None:
            print("resiliency-simulate: --ckpt-tmpfs needs --ckpt-dir", file=sys.stderr)
            return 2
        try:
            _mount_tmpfs(args.ckpt_dir, args.ckpt_tmpfs)
        except SimulatorError as exc:
            print(f"resiliency-simulate: {exc}", file=sys.stderr)
            return 2
    recorder = Recorder(goodput_dir, job=job, node="simulator")
    runner = JobRunner(
        RunnerOptions(
            command=command,
            nodes=args.nodes,
            node_start_delay_s=args.node_start_delay,
            restart_nodes_after_s=args.restart_nodes_after,
            grace_s=args.grace,
            slow_ratio=args.slow_ratio,
            slow_duration_s=args.slow_duration,
            ckpt_dir=args.ckpt_dir,
            local_ckpt_dir=args.local_ckpt_dir,
            disk_full_hold_s=args.disk_full_hold,
            goodput_dir=goodput_dir,
            env={JOB_ID_ENV: job},
            faults_from_first_step=args.from_first_step,
        )
    )

    def record(injection: Injection) -> None:
        recorder.emit(
            "fault_injected",
            kind=injection.fault.kind,
            victim=injection.victim or "none",
        )
        recorder.flush()

    try:
        injections = runner.run(plan, args.duration, record)
    except SimulatorError as exc:  # e.g. no first step to time the faults from
        print(f"resiliency-simulate: {exc}", file=sys.stderr)
        return 1
    finally:
        recorder.close()
        if args.ckpt_tmpfs:
            _unmount(args.ckpt_dir)
    timeline = timeline_of(read_ledger([goodput_dir]))
    print(format_table(outcomes(injections, timeline, runner.t0_wall)))
    print(f"ledger: {goodput_dir}  (resiliency-goodput report {goodput_dir})")
    codes = sorted(set(runner.exit_codes.values()))
    print(f"launcher exit code(s): {', '.join(map(str, codes)) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
