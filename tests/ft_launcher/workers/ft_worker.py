"""A light training rank for launcher tests: the real client, no torch (starts in milliseconds).

Every behaviour is chosen on the command line; a fault fires only on --fault-rank and only when
TORCHELASTIC_RESTART_COUNT equals --fault-attempt, so the restarted group runs clean.
Marker files under --marker-dir record what happened: start-<rank>-<attempt>-<pid>,
done-<rank>-<attempt>, sigterm-<rank>-<attempt>, armed-<rank>-<attempt> (SIGTERM handler set),
hang-<rank>-<attempt>, child-<pid>.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from resiliency.ft import RankMonitorClient, WorkloadAction, WorkloadControlRequest

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _wait_for_armed_peers(marker: Path, timeout_s: float = 120.0) -> None:
    """Wait until every rank of this attempt has marked ``armed``, or fail naming the others."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    wanted = {f"armed-{rank}-{ATTEMPT}" for rank in range(world)}
    deadline = time.monotonic() + timeout_s
    while missing := wanted - {p.name for p in marker.iterdir()}:
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {RANK}: {sorted(missing)} not marked within {timeout_s:.0f} s")
        time.sleep(0.05)


def mark(directory: Path, name: str) -> None:
    # Written aside and renamed: a test that sees the name may read the content at once.
    tmp = directory / f".{name}.tmp"
    tmp.write_text(f"{time.time()}\n")
    os.replace(tmp, directory / name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-attempt", type=int, default=0)
    parser.add_argument("--fault-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--marker-dir", type=Path, required=True)
    args = parser.parse_args()
    marker = args.marker_dir
    mark(marker, f"start-{RANK}-{ATTEMPT}-{os.getpid()}")
    mark(marker, f"parent-{RANK}-{ATTEMPT}-{os.getppid()}")
    faulty = args.fault_rank == RANK and args.fault_attempt in (ATTEMPT, -1)
    if "FT_TEST_FAULT_NODE" in os.environ:
        # Multi-node tests pick the faulty node (not the rank, which the rendezvous assigns).
        faulty = os.environ["FT_TEST_FAULT_NODE"] == "1" and args.fault_attempt in (ATTEMPT, -1)
    mode = args.mode if faulty else "ok"

    if mode == "hang_before_hb":
        time.sleep(3600)

    # The signal modes are about the launcher's forwarding: every rank behaves the same.
    if args.mode == "ignore_sigterm":
        signal.signal(signal.SIGTERM, lambda s, f: mark(marker, f"sigterm-{RANK}-{ATTEMPT}"))
    elif args.mode == "exit_on_sigterm":

        def _exit(signum: int, frame: object) -> None:
            mark(marker, f"sigterm-{RANK}-{ATTEMPT}")
            sys.exit(0)

        signal.signal(signal.SIGTERM, _exit)
    elif args.mode == "crash_reads_stop_mark":
        # Like an emergency-checkpoint handler: the launcher's stop mark says whether this
        # SIGTERM is a preemption (keep running to save) or the launcher's own stop (die).
        stop_mark = Path(os.environ["RESILIENCY_EXIT_INFO_DIR"]) / "launcher_stopping"

        def _on_term(signum: int, frame: object) -> None:
            if stop_mark.read_bytes()[:1] == b"\1":
                mark(marker, f"launcherstop-{RANK}-{ATTEMPT}")
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)
            mark(marker, f"preemption-{RANK}-{ATTEMPT}")

        signal.signal(signal.SIGTERM, _on_term)
    if args.mode == "child_ignores_sigterm":
        # Like a data-loader worker that ignores SIGTERM: must not outlive the launcher.
        code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
        child = subprocess.Popen([sys.executable, "-c", code])
        mark(marker, f"child-{child.pid}")

    client = RankMonitorClient()
    client.init_workload_monitoring()
    if args.mode in ("ignore_sigterm", "exit_on_sigterm", "crash_reads_stop_mark"):
        # The SIGTERM handler is in place and the rank monitor connected: a group SIGTERM sent
        # earlier could end the monitor mid-handshake, and the worker with an error of its own.
        mark(marker, f"armed-{RANK}-{ATTEMPT}")
    use_sections = args.mode.endswith("section") or args.mode == "sections"
    for step in range(args.steps):
        if use_sections:
            client.start_section("step")
        if step == args.fault_step:
            if mode in ("hang_hb", "hang_in_section"):
                mark(marker, f"hang-{RANK}-{ATTEMPT}")
                time.sleep(3600)
            elif mode == "crash":
                os._exit(7)
            elif mode == "crash_reads_stop_mark":
                # Every rank's handler must be in place first: a peer still importing when the
                # launcher stops it dies of the SIGTERM's default action and marks nothing.
                _wait_for_armed_peers(marker)
                os._exit(7)
            elif mode == "exception":
                raise RuntimeError(f"injected failure on rank {RANK} at step {step}")
            elif mode == "wlc_shutdown":
                client.send_workload_control_request(
                    WorkloadControlRequest(WorkloadAction.ShutdownWorkload, "injected: stop")
                )
                time.sleep(3600)
            elif mode == "wlc_exclude":
                client.send_workload_control_request(
                    WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "injected: bad node")
                )
                time.sleep(3600)
        time.sleep(args.step_time)
        client.send_heartbeat()
        if use_sections:
            client.end_section("step")
    if args.mode in ("ignore_sigterm", "exit_on_sigterm", "child_ignores_sigterm"):
        while True:  # run until the launcher is signalled
            time.sleep(0.05)
            client.send_heartbeat()
    client.shutdown_workload_monitoring()
    mark(marker, f"done-{RANK}-{ATTEMPT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
