"""``resiliency-host-daemon``: a node sensor that outlives the launcher.

It publishes the host's GPU health (and that it is alive) under ``hosts/<node>`` every interval,
so that a GPU fault is seen, and the node excluded, even while no launcher runs on it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from resiliency.supervisor.connect import backend_from_url
from resiliency.supervisor.errors import SupervisorError
from resiliency.supervisor.sensor import DEFAULT_INTERVAL_S, NODE_ID_ENV, NodeSensor

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the host daemon until SIGTERM/SIGINT; return the exit code."""
    parser = argparse.ArgumentParser(
        prog="resiliency-host-daemon", description="Publish this host's health for the supervisor."
    )
    parser.add_argument("backend", metavar="BACKEND_URL", help="tcp://HOST:PORT[/JOB] or etcd://")
    parser.add_argument(
        "--node", default=None, help="node id (default: $RESILIENCY_NODE_ID, else the host name)"
    )
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECS")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[host-daemon] %(asctime)s %(message)s")
    node = args.node or os.environ.get(NODE_ID_ENV) or socket.gethostname()
    try:
        backend = backend_from_url(args.backend)
        sensor = NodeSensor(
            backend,
            node,
            lambda: {"state": "host"},
            interval=args.interval,
            ledger_dir="",
            host_daemon=True,
        )
    except SupervisorError as exc:
        parser.error(str(exc))
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    sensor.start()
    done.wait()
    sensor.stop(final=False)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
