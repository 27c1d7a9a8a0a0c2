"""``resiliency-supervisor``: the job's controller, and the job's status as a table."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from resiliency.goodput import DIR_ENV
from resiliency.supervisor.connect import backend_from_url
from resiliency.supervisor.controller import Controller
from resiliency.supervisor.errors import StaleGenerationError, SupervisorError
from resiliency.supervisor.policies import load_policies
from resiliency.supervisor.status_table import job_rows, render_table

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resiliency-supervisor",
        description="Job-wide supervision of ft-launcher nodes through a TCPStore or etcd.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ctl = sub.add_parser("controller", help="run the job's controller")
    ctl.add_argument("backend", metavar="BACKEND_URL", help="tcp://HOST:PORT[/JOB] or etcd://...")
    ctl.add_argument(
        "--policy",
        default=None,
        metavar="YAML",
        help="policy file (default: every policy with its defaults)",
    )
    ctl.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="SECS",
        help="cycle interval (default: the policy file's, else 5)",
    )
    ctl.add_argument(
        "--serve", action="store_true", help="host the TCPStore in this process (tcp:// only)"
    )
    ctl.add_argument(
        "--goodput-dir",
        default=None,
        metavar="DIR",
        help="goodput ledger directory for the decisions (default: $RESILIENCY_GOODPUT_DIR)",
    )
    ctl.add_argument("--cycles", type=int, default=None, help=argparse.SUPPRESS)
    st = sub.add_parser("status", help="print every node's status as a table")
    st.add_argument("backend", metavar="BACKEND_URL")
    st.add_argument("--json", action="store_true", help="print the rows as JSON")
    return parser


def _controller(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.goodput_dir:
        os.environ[DIR_ENV] = os.path.abspath(args.goodput_dir)
    try:
        policies, interval = load_policies(args.policy)
        backend = backend_from_url(args.backend, server=args.serve)
    except SupervisorError as exc:
        parser.error(str(exc))
    controller = Controller(backend, policies, interval=args.interval or interval)

    def _stop(signum: int, frame: FrameType | None) -> None:
        controller.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    logging.getLogger(__name__).info(
        "controller for %s: policies %s, every %.2f s",
        backend.url,
        ", ".join(p.name for p in policies),
        controller.interval,
    )
    try:
        controller.run(max_cycles=args.cycles)
    except StaleGenerationError:
        return 1  # logged by the controller: a newer one runs
    finally:
        backend.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``resiliency-supervisor``; return the exit code."""
    logging.basicConfig(
        level=logging.INFO,
        format="[supervisor] %(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "controller":
        return _controller(args, parser)
    try:
        backend = backend_from_url(args.backend)
        try:
            rows = job_rows(backend)
        finally:
            backend.close()  # its connection goes now, not at the next garbage collection
    except SupervisorError as exc:
        print(f"resiliency-supervisor status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows))
    else:
        print(render_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
