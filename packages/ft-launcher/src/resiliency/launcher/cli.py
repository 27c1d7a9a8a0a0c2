"""The ``ft-launcher`` / ``ft_launcher`` console script."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.errors import record

from resiliency.ft import FaultToleranceError, config_from_args
from resiliency.launcher._torch_compat import check_torch_version
from resiliency.launcher.errors import LauncherError
from resiliency.launcher.launch import build_health_checks, launch
from resiliency.launcher.monitors import MonitorSet
from resiliency.launcher.options import LauncherOptions, build_parser
from resiliency.launcher.supervision import check_supervision_args

__all__ = ["main", "run"]

_LOG_FORMAT = "[ft-launcher] %(asctime)s %(levelname)s %(message)s"


@record
def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, validate everything, run the job; return the exit code.

    A bad flag, a bad config file or a failed setup stops the launcher with exit code 2 before
    any monitor or worker starts. When the workers failed with no restart left it raises
    torch's ``ChildFailedError``, as torchrun does (its table names the root cause; under
    ``TORCHELASTIC_ERROR_FILE`` the failed worker's error file is copied there), exit code 1.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit code (see :mod:`resiliency.launcher.exit_codes`).
    """
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT, stream=sys.stderr)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_torch_version()
        ft_cfg = config_from_args(args)
        options = LauncherOptions.from_args(args)
        health_checks = build_health_checks(options)
        check_supervision_args(args)
        nproc = str(args.nproc_per_node)
        # "gpu"/"auto" resolve later; assume up to 1,000 local ranks for the path check.
        MonitorSet.check_socket_paths(int(nproc) if nproc.isdigit() else 1000)
    except (FaultToleranceError, LauncherError) as exc:
        parser.error(str(exc))
    logging.getLogger("resiliency").setLevel(ft_cfg.log_level)
    return launch(args, ft_cfg, options, health_checks)


def run() -> NoReturn:
    """The console scripts' entry point: :func:`main`, then a prompt exit with its code.

    A scheduler that replaces a failed or preempted node waits for this process to end. Once
    the job is over, its atexit handlers (ledger flushes) run, and the interpreter's teardown
    of torch (a second or more on a busy node) is skipped. An exception, or a thread that is
    still running, takes Python's ordinary exit instead.
    """
    code = main() or 0
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
