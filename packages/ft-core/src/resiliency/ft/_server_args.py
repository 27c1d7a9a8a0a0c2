"""The command line of ``python -m resiliency.ft.server`` (the launcher builds it)."""

from __future__ import annotations

import argparse


def parse_server_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the rank monitor's arguments (default: ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        prog="python -m resiliency.ft.server",
        description="Rank monitor: watches one local rank's heartbeats and sections.",
    )
    parser.add_argument("--socket", required=True, help="socket path (its directory: mode 0700)")
    parser.add_argument("--local-rank", type=int, required=True, help="the local rank served")
    parser.add_argument(
        "--config-json", default="{}", help="FaultToleranceConfig.to_json() output (default: {})"
    )
    parser.add_argument("--worker-pid", type=int, default=None, help="the worker's pid, if known")
    return parser.parse_args(argv)
