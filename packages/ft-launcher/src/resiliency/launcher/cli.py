"""The ``ft-launcher`` / ``ft_launcher`` console script.

This module imports nothing heavy at its top: :func:`run` starts the ``--ft-preimport`` fork
server before the launcher itself imports torch, so the two imports run side by side.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from resiliency.launcher.fork_server import ForkServer

__all__ = ["main", "run"]

logger = logging.getLogger(__name__)

_LOG_FORMAT = "[ft-launcher] %(asctime)s %(levelname)s %(message)s"
_PREIMPORT_FLAG = "--ft-preimport"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, validate everything, run the job; return the exit code.

    A bad flag, a bad config file or a failed setup stops the launcher with exit code 2 before
    any monitor or worker starts. When the workers failed with no restart left it logs torch's
    failure table (as torchrun shows it, without the traceback) before its final line, copies the
    root-cause worker's error file to ``TORCHELASTIC_ERROR_FILE`` when that is set, and returns 1.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit code (see :mod:`resiliency.launcher.exit_codes`).
    """
    return _main(argv, None)


def _main(argv: Sequence[str] | None, early: ForkServer | None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record  # noqa: PLC0415

    try:
        return record(_parse_and_launch)(argv, early) or 0
    except BaseException:
        if early is not None:  # e.g. the command line was refused (closing twice is harmless)
            early.close()
        raise


def _parse_and_launch(argv: Sequence[str] | None, early: ForkServer | None) -> int:
    # The heavy imports (torch's launcher, pydantic) wait until the fork server is started.
    from resiliency.ft import FaultToleranceError, config_from_args  # noqa: PLC0415
    from resiliency.launcher._launch import build_health_checks, launch  # noqa: PLC0415
    from resiliency.launcher._monitors import MonitorSet  # noqa: PLC0415
    from resiliency.launcher._supervision import check_supervision_args  # noqa: PLC0415
    from resiliency.launcher._torch_compat import check_torch_version  # noqa: PLC0415
    from resiliency.launcher.errors import LauncherError  # noqa: PLC0415
    from resiliency.launcher.options import LauncherOptions, build_parser  # noqa: PLC0415

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
    if early is not None and tuple(early.modules) != options.preimport:
        early.close()  # the parser read the flag differently: launch starts the right one
        early = None
    return launch(args, ft_cfg, options, health_checks, fork_server=early)


def _early_modules(argv: Sequence[str]) -> list[str]:
    """The modules of ``--ft-preimport MODULES`` read straight from the command line.

    Only the plain spellings before the training script count; anything else (help, an
    abbreviation, a module name that is not one) is left to the real parser, which starts
    the server itself. A wrong guess only costs a server that is closed unused.
    """
    for i, token in enumerate(argv):
        if token in ("-h", "--help", "--"):
            return []
        if token.endswith(".py") or token in ("-m", "--module", "--no-python", "--no_python"):
            return []  # the training command starts here: its arguments are not ours
        value = None
        if token == _PREIMPORT_FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(_PREIMPORT_FLAG + "="):
            value = token.split("=", 1)[1]
        if value is not None:
            names = [n.strip() for n in value.split(",") if n.strip()]
            valid = all(part.isidentifier() for n in names for part in n.split("."))
            return names if valid else []
    return []


def _start_early(argv: Sequence[str]) -> ForkServer | None:
    modules = _early_modules(argv)
    if not modules:
        return None
    try:
        return ForkServer(modules, wait=False)
    except Exception as exc:
        logger.debug("early fork server start failed: %s", exc)
        return None


def run() -> NoReturn:
    """The console scripts' entry point: :func:`main`, then a prompt exit with its code.

    With ``--ft-preimport`` the fork server starts first, so that its imports and the
    launcher's own run at the same time. A scheduler that replaces a failed or preempted node
    waits for this process to end. Once the job is over, its atexit handlers (ledger flushes)
    run, and the interpreter's teardown of torch (a second or more on a busy node) is skipped.
    An exception, or a thread that is still running, takes Python's ordinary exit instead.
    """
    code = _main(None, _start_early(sys.argv[1:])) or 0
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
