"""The ft-launcher command line: torchrun's parser plus one "fault tolerance" group.

Every torchrun flag is torchrun's own (``torch.distributed.run.get_args_parser()``); the fault
tolerance group adds ft-core's config flags and the launcher's own.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from torch.distributed.run import get_args_parser as torchrun_args_parser

from resiliency.ft import add_ft_arguments
from resiliency.launcher._contracts import FINISHED_FLAG_ENV
from resiliency.launcher._supervision import add_supervision_arguments
from resiliency.launcher.errors import LauncherConfigError
from resiliency.launcher.policy import AnyFailedPolicy, MinHealthyPolicy

__all__ = ["LauncherOptions", "build_parser"]

DEFAULT_WORKERS_STOP_TIMEOUT = 15.0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return torchrun's argument parser extended with the fault-tolerance group.

    Returns:
        The parser; ``ft-launcher --help`` prints it.
    """
    parser = torchrun_args_parser()
    parser.prog = "ft-launcher"
    parser.description = (
        "ft-launcher: torchrun with rank monitors. Every torchrun flag works as in torchrun; the "
        "'fault tolerance' group adds hang detection, restart policies and workload control."
    )
    group = add_ft_arguments(parser)
    add_supervision_arguments(group)  # --supervisor, --status-port (resiliency-supervisor extra)
    group.add_argument(
        "--restart-policy",
        "--ft-restart-policy",
        dest="restart_policy",
        choices=[AnyFailedPolicy.name, MinHealthyPolicy.name],
        default=AnyFailedPolicy.name,
        help="any-failed: any failed or hung worker restarts the group on every node (counted "
        "against --max-restarts). min-healthy: a failed node steps aside while at least MIN "
        "nodes of --nnodes MIN:MAX stay healthy; the group restarts when fewer are. "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--term-timeout",
        dest="term_timeout",
        type=_positive_float,
        default=None,
        metavar="SECS",
        help="When the launcher gets SIGTERM/SIGINT it forwards the signal to the workers and "
        "SIGKILLs those still alive after this long (default: --shutdown-timeout, else 30).",
    )
    group.add_argument(
        "--workers-stop-timeout",
        dest="workers_stop_timeout",
        type=_positive_float,
        default=DEFAULT_WORKERS_STOP_TIMEOUT,
        metavar="SECS",
        help="When stopping workers for a restart: SIGTERM, then SIGKILL after this long "
        "(default: %(default)s).",
    )
    group.add_argument(
        "--node-health-check-cmd",
        dest="node_health_check_cmd",
        default=None,
        metavar="CMD",
        help="Command run before every (re)join of the rendezvous; a non-zero exit takes this "
        "node out of the job (exit code 4).",
    )
    group.add_argument(
        "--node-health-check-fn",
        dest="node_health_check_fn",
        default=None,
        metavar="MODULE:FUNCTION",
        help="Python callable run before every (re)join; False or an exception takes this node "
        "out of the job (exit code 4).",
    )
    group.add_argument(
        "--no-gpu-health-check",
        dest="gpu_health_check",
        action="store_false",
        help="Skip the built-in NVML GPU check (it is skipped anyway without NVML or a driver).",
    )
    group.add_argument(
        "--finished-flag-file",
        dest="finished_flag_file",
        default=None,
        metavar="PATH",
        help=f"Passed to the workers as {FINISHED_FLAG_ENV} (default: inherited from the "
        "environment); the training script creates it when training is complete.",
    )
    group.add_argument(
        "--goodput-dir",
        dest="goodput_dir",
        default=None,
        metavar="DIR",
        help="Write goodput events (job, cycles, hangs) to this node's ledger file in DIR, a "
        "directory shared by the job, and set RESILIENCY_GOODPUT_DIR for the workers "
        "(default: RESILIENCY_GOODPUT_DIR, else none). See resiliency-goodput report.",
    )
    group.add_argument(
        "--ft-preimport",
        dest="preimport",
        default="",
        metavar="MODULES",
        help="Comma-separated modules (e.g. torch,lightning) a fork server imports once at "
        "launch; every worker of every restart is then forked from it instead of starting a "
        "new interpreter that imports them again. Only for 'python [-u] SCRIPT' and "
        "'python -m MODULE' workers. (default: off)",
    )
    group.add_argument(
        "--ft-inprocess-respawn",
        dest="inprocess_respawn",
        action="store_true",
        help="For workers that train under resiliency.inprocess.Wrapper: a worker killed by a "
        "signal (SIGKILL, a segfault, the OOM killer) is respawned alone (forked from the "
        "--ft-preimport server if any) while the others keep running; its Wrapper rejoins "
        "them in-process. Each respawn counts against --max-restarts; a respawned worker that "
        "does not join within --ft-respawn-timeout makes the group restart as usual. "
        "(default: off)",
    )
    group.add_argument(
        "--ft-respawn-timeout",
        dest="respawn_timeout",
        type=_positive_float,
        default=60.0,
        metavar="SECS",
        help="How long a worker respawned by --ft-inprocess-respawn has to join the running "
        "job before the whole group is restarted (default: %(default)s).",
    )
    group.add_argument(
        "--exit-status-file",
        dest="exit_status_file",
        default=None,
        metavar="PATH",
        help="Write the launcher's verdict (exit code, reason, restarts) to this JSON file.",
    )
    return parser


@dataclass(frozen=True)
class LauncherOptions:
    """The launcher's own settings, read from the parsed arguments.

    Attributes:
        restart_policy: "any-failed" or "min-healthy".
        term_timeout: seconds between the forwarded signal and SIGKILL (None: torchrun's).
        workers_stop_timeout: seconds between SIGTERM and SIGKILL when stopping for a restart.
        node_health_check_cmd: optional health-check command.
        node_health_check_fn: optional health-check callable ("module:function").
        gpu_health_check: run the NVML GPU check.
        finished_flag_file: value for FAULT_TOL_FINISHED_FLAG_FILE, if given.
        exit_status_file: where to write the verdict JSON, if given.
        preimport: modules the fork server imports (empty: no fork server).
        inprocess_respawn: respawn a worker killed by a signal alone (``--ft-inprocess-respawn``).
        respawn_timeout: seconds a respawned worker has to join (``--ft-respawn-timeout``).
    """

    restart_policy: str
    term_timeout: float | None
    workers_stop_timeout: float
    node_health_check_cmd: str | None
    node_health_check_fn: str | None
    gpu_health_check: bool
    finished_flag_file: str | None
    exit_status_file: str | None
    preimport: tuple[str, ...] = ()
    inprocess_respawn: bool = False
    respawn_timeout: float = 60.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LauncherOptions:
        """Read the options from parsed arguments.

        Args:
            args: the namespace from :func:`build_parser`.

        Returns:
            The options.

        Raises:
            LauncherConfigError: the options contradict each other.
        """
        finished = args.finished_flag_file or os.environ.get(FINISHED_FLAG_ENV) or None
        if args.term_timeout is not None and args.term_timeout > 24 * 3600:
            raise LauncherConfigError(f"--term-timeout {args.term_timeout} s is over a day")
        return cls(
            restart_policy=args.restart_policy,
            term_timeout=args.term_timeout,
            workers_stop_timeout=args.workers_stop_timeout,
            node_health_check_cmd=args.node_health_check_cmd,
            node_health_check_fn=args.node_health_check_fn,
            gpu_health_check=args.gpu_health_check,
            finished_flag_file=os.path.abspath(finished) if finished else None,
            exit_status_file=args.exit_status_file,
            preimport=_module_list(args.preimport),
            inprocess_respawn=args.inprocess_respawn,
            respawn_timeout=args.respawn_timeout,
        )


def _module_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not all(part.isidentifier() for part in n.split("."))]
    if bad:
        raise LauncherConfigError(f"--ft-preimport: {', '.join(bad)} is not a module name")
    return names
