"""The training rank of the hang demo (run by examples/demo_hang.py, not by hand).

It trains a few steps, each inside a ``train_step`` section followed by a heartbeat, then hangs in
``all_reduce_gradients`` the way a rank hangs when a peer dies in the middle of a collective.
"""

from __future__ import annotations

import time

from resiliency.ft import RankMonitorClient

HANG_AT_STEP = 5


def all_reduce_gradients(step: int) -> None:
    """Stand-in for a collective; at HANG_AT_STEP it never returns."""
    if step == HANG_AT_STEP:
        print(f"step {step}: entering all_reduce_gradients... (a peer died; this never returns)")
        time.sleep(3600)
    time.sleep(0.02)


def train(client: RankMonitorClient) -> None:
    for step in range(100):
        client.start_section("train_step")
        time.sleep(0.1)  # forward and backward
        all_reduce_gradients(step)
        client.end_section("train_step")
        client.send_heartbeat()
        print(f"step {step} done; heartbeat sent at t={time.monotonic():.3f}")


def main() -> None:
    client = RankMonitorClient()
    client.init_workload_monitoring()
    limits = client.cfg.rank_section_timeouts if client.cfg else {}
    print(f"connected to the rank monitor; section timeouts: {limits}")
    train(client)
    client.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
