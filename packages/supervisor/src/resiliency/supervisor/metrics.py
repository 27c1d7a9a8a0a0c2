"""The Prometheus status endpoint of a node, through ``prometheus_client``.

A custom collector renders the node's latest :class:`~resiliency.supervisor.document.NodeStatus`
at scrape time (no metric objects to keep in sync, and nothing between two scrapes):

- ``resiliency_heartbeat_age_seconds{rank}``, ``resiliency_open_section{rank,section}``
- ``resiliency_last_step``, ``resiliency_restarts_total``, ``resiliency_hangs_total{timer}``
- ``resiliency_straggler_score{rank,kind}``, ``resiliency_checkpoint_age_seconds``
- ``resiliency_node_state{state}`` and ``resiliency_gpu_ecc_uncorrectable{gpu}``
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from resiliency.supervisor.document import NODE_STATES, NodeStatus

__all__ = ["StatusCollector", "StatusServer", "start_status_server"]

logger = logging.getLogger(__name__)


class StatusCollector:
    """A ``prometheus_client`` collector over a function returning the node's latest status.

    Args:
        latest: returns the latest :class:`NodeStatus` (None before the first sample).
    """

    def __init__(self, latest: Callable[[], NodeStatus | None]) -> None:
        self._latest = latest

    def describe(self) -> list[Metric]:
        """No static description: metrics depend on the sample (skips a collect at register)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Render the latest sample."""
        status = self._latest()
        hb = GaugeMetricFamily(
            "resiliency_heartbeat_age_seconds",
            "Seconds since the rank's last heartbeat",
            labels=["rank"],
        )
        section = GaugeMetricFamily(
            "resiliency_open_section",
            "1 for the rank's innermost open section",
            labels=["rank", "section"],
        )
        step = GaugeMetricFamily("resiliency_last_step", "The last training step seen")
        restarts = CounterMetricFamily("resiliency_restarts", "Worker-group restarts on this node")
        hangs = CounterMetricFamily(
            "resiliency_hangs", "Hangs detected, by timer", labels=["timer"]
        )
        straggler = GaugeMetricFamily(
            "resiliency_straggler_score",
            "Latest straggler score (1.0 = as fast as expected)",
            labels=["rank", "kind"],
        )
        ckpt = GaugeMetricFamily(
            "resiliency_checkpoint_age_seconds", "Seconds since the last committed checkpoint"
        )
        state = GaugeMetricFamily(
            "resiliency_node_state", "1 for the node's state", labels=["state"]
        )
        ecc = GaugeMetricFamily(
            "resiliency_gpu_ecc_uncorrectable", "Volatile uncorrectable ECC errors", labels=["gpu"]
        )
        if status is not None:
            for rank, rs in sorted(status.ranks.items()):
                if rs.hb_age is not None:
                    hb.add_metric([str(rank)], rs.hb_age)
                if rs.section is not None:
                    section.add_metric([str(rank), rs.section], 1.0)
            if status.step is not None:
                step.add_metric([], float(status.step))
            restarts.add_metric([], float(status.restarts))
            for timer, count in sorted(status.hangs.items()):
                hangs.add_metric([timer], float(count))
            for rank, kinds in sorted(status.straggler.items()):
                for kind, score in sorted(kinds.items()):
                    straggler.add_metric([str(rank), kind], score)
            if status.checkpoint_age is not None:
                ckpt.add_metric([], status.checkpoint_age)
            for name in NODE_STATES:
                state.add_metric([name], 1.0 if name == status.state else 0.0)
            for device in status.gpu:
                ecc.add_metric([str(device.index)], float(device.ecc_uncorrectable))
        yield from (hb, section, step, restarts, hangs, straggler, ckpt, state, ecc)


class StatusServer:
    """A running status endpoint.

    Attributes:
        host: the bound address.
        port: the bound port (the real one when 0 was asked for).
    """

    def __init__(self, server: Any, thread: Any, host: str, port: int) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port = port

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


def start_status_server(
    latest: Callable[[], NodeStatus | None], port: int, host: str = "127.0.0.1"
) -> StatusServer:
    """Serve the Prometheus text format of ``latest()`` on ``host:port`` (a daemon thread).

    Args:
        latest: returns the node's latest status.
        port: the port (0: any free one).
        host: the address to bind (loopback unless told otherwise; any other address is
            logged once as a warning naming it).

    Returns:
        The running server.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(latest))
    server, thread = start_http_server(port, addr=host, registry=registry)
    bound = int(server.server_address[1])
    logger.info("status endpoint: http://%s:%d/metrics", host, bound)
    if not _is_loopback(host):
        logger.warning(
            "status endpoint bound to %s:%d, reachable from other hosts: anyone who reaches it "
            "reads this node's status (no authentication); the default is 127.0.0.1",
            host,
            bound,
        )
    return StatusServer(server, thread, host, bound)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
