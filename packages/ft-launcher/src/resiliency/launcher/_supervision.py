"""Opt-in job-wide supervision: ``--supervisor BACKEND_URL`` and ``--status-port PORT``.

With ``--supervisor`` the launcher runs a node sensor of :mod:`resiliency.supervisor` (one
document per interval into the job's TCPStore or etcd) and acts on the intents the controller
writes for this node, through what the agent already does: leave the job (exit 4; a spare joins
at the next rendezvous), restart the workers (a new round, not charged to ``--max-restarts``),
or shut the job down (exit 3). With ``--status-port`` it serves the node's status in the
Prometheus text format (bound to 127.0.0.1 unless ``--status-host``).

``resiliency.supervisor`` is an optional extra of ft-launcher: it is imported only here, only
its ``__all__`` names, and only when one of the flags is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import WorkerState

from resiliency.ft import MonitorEvent
from resiliency.launcher._contracts import NODE_ID_ENV
from resiliency.launcher.errors import LauncherConfigError

if TYPE_CHECKING:
    from resiliency.launcher._monitors import MonitorSet

__all__ = [
    "NodeView",
    "Supervision",
    "SupervisorRequest",
    "add_supervision_arguments",
    "check_supervision_args",
    "start_supervision",
]

logger = logging.getLogger(__name__)

_MAX_FAILURES = 10
_EXCLUDED_REASONS = ("node_excluded", "node_unhealthy")


def add_supervision_arguments(group: argparse._ArgumentGroup) -> None:
    """Add ``--supervisor``, ``--supervisor-interval``, ``--node-id``, ``--status-port`` and
    ``--status-host`` to the fault-tolerance group."""
    group.add_argument(
        "--supervisor",
        dest="supervisor",
        default=None,
        metavar="BACKEND_URL",
        help="Publish this node's status to the job's supervisor and act on its "
        "intents: tcp://HOST:PORT[/JOB] (a c10d TCPStore, e.g. the rendezvous "
        "endpoint) or etcd://HOST:PORT[/JOB]. Needs resiliency-supervisor.",
    )
    group.add_argument(
        "--supervisor-interval",
        dest="supervisor_interval",
        type=float,
        default=5.0,
        metavar="SECS",
        help="Seconds between two status documents (default: %(default)s).",
    )
    group.add_argument(
        "--node-id",
        dest="node_id",
        default=None,
        metavar="ID",
        help=f"This node's id for the supervisor (default: ${NODE_ID_ENV}, else the host name).",
    )
    group.add_argument(
        "--status-port",
        dest="status_port",
        type=int,
        default=None,
        metavar="PORT",
        help="Serve this node's status in the Prometheus text "
        "format on this port (0: any free port, logged).",
    )
    group.add_argument(
        "--status-host",
        dest="status_host",
        default="127.0.0.1",
        metavar="ADDR",
        help="Address of the status endpoint (default: %(default)s).",
    )


def check_supervision_args(args: argparse.Namespace) -> None:
    """Check the supervision flags before anything starts.

    Raises:
        LauncherConfigError: resiliency-supervisor is missing, or a flag is invalid.
    """
    if args.supervisor is None and args.status_port is None:
        return
    try:
        from resiliency.supervisor import SupervisorError, parse_backend_url  # noqa: PLC0415
    except ImportError:
        raise LauncherConfigError(
            "--supervisor / --status-port need resiliency-supervisor (the 'supervisor' "
            "extra); from a checkout: uv pip install './packages/ft-launcher[supervisor]'"
        ) from None
    if args.supervisor_interval <= 0:
        raise LauncherConfigError("--supervisor-interval must be > 0 seconds")
    if args.status_port is not None and not 0 <= args.status_port <= 65535:
        raise LauncherConfigError(f"--status-port {args.status_port} is not a port")
    if args.supervisor is not None:
        try:
            parse_backend_url(args.supervisor)
        except SupervisorError as exc:
            raise LauncherConfigError(f"--supervisor: {exc}") from None


def normalize_cause(text: str) -> str:
    """A cycle's root cause, without pids and ranks: ``hang:heartbeat``, ``exit:1``, ``peer``..."""
    if text.startswith("likely culprit of the hang"):
        return "hang:culprit"
    if match := re.search(r"hung: (\S+) timer", text):
        return f"hang:{match.group(1)}"
    if match := re.search(r"exited with code (-?\d+)", text):
        return f"exit:{match.group(1)}"
    if match := re.search(r"killed by signal (\w+)", text):
        return f"signal:{match.group(1)}"
    if "another node failed" in text:
        return "peer"
    return re.sub(r"\d+", "N", text)[:80]


@dataclass(frozen=True)
class NodeView:
    """What the agent shows the sensor (read on the sensor thread).

    Attributes:
        outcome_reason: how the job ended on this node (``Outcome.reason``), None while it runs.
        worker_state: torch's state of the worker group.
        group_rank: this node's group rank in the current round.
        ranks: local rank -> global rank of the current workers.
        attempt_causes: the root cause of every failed attempt, oldest first.
        restarts: restarts done so far.
    """

    outcome_reason: str | None
    worker_state: WorkerState
    group_rank: int | None
    ranks: dict[int, int]
    attempt_causes: list[str]
    restarts: int


@dataclass(frozen=True)
class SupervisorRequest:
    """An intent of the controller for this node, for the agent's loop to carry out.

    Attributes:
        action: ``exclude`` (leave the job, exit 4), ``shutdown`` (stop the job, exit 3) or
            ``restart`` (restart the workers in a new round, not charged to ``--max-restarts``).
        detail: who asked and why (``supervisor (POLICY): REASON``), for the logs and outcome.
    """

    action: str
    detail: str


class Supervision:
    """The launcher side of the supervisor: a sensor over this node, and the intents it takes.

    Args:
        args: the parsed flags.
        view: returns what the agent shows of this node now (called on the sensor thread).
        monitors: this node's rank monitors.
    """

    def __init__(
        self, args: argparse.Namespace, view: Callable[[], NodeView], monitors: MonitorSet
    ) -> None:
        from resiliency.supervisor import NodeSensor, backend_from_url  # noqa: PLC0415

        self._view = view
        self._monitors = monitors
        self._lock = threading.Lock()
        self._intent: Any = None
        self._ran = False
        self.hangs: dict[str, int] = {}
        monitors.add_listener(self._on_event)
        self.node = args.node_id or os.environ.get(NODE_ID_ENV) or socket.gethostname()
        self._url: str | None = args.supervisor
        self._backend = backend_from_url(args.supervisor) if args.supervisor else None
        self._exchange: Any = None
        self.sensor = NodeSensor(
            self._backend,
            self.node,
            self.probe,
            interval=args.supervisor_interval,
            on_intent=self._on_intent,
        )
        self._server: Any = None
        self._status = (args.status_host, args.status_port)

    # -- the probe (sensor thread) ---------------------------------------------------------------
    def _on_event(self, event: MonitorEvent) -> None:
        if event.kind == "hang" and event.timer:
            with self._lock:
                self.hangs[event.timer] = self.hangs.get(event.timer, 0) + 1

    def _state(self, view: NodeView) -> str:
        if view.outcome_reason is not None:
            return "excluded" if view.outcome_reason in _EXCLUDED_REASONS else "stopped"
        state = view.worker_state
        if state == WorkerState.HEALTHY:
            self._ran = True
            return "running"
        if state == WorkerState.SUCCEEDED:
            return "stopped"
        return "restarting" if self._ran else "waiting"

    def probe(self) -> dict[str, Any]:
        """What this launcher knows, as fields of a ``NodeStatus``."""
        from resiliency.supervisor import RankStatus  # noqa: PLC0415

        view = self._view()
        state = self._state(view)
        ranks = {}
        if state in ("running", "restarting"):
            watch = self._monitors.watch_status()
            for local_rank, rank in sorted(view.ranks.items()):
                hb_age, section = watch.get(local_rank, (None, None))
                ranks[rank] = RankStatus(hb_age=hb_age, section=section)
        causes = view.attempt_causes[-_MAX_FAILURES:]
        first = len(view.attempt_causes) - len(causes)
        with self._lock:
            hangs = dict(self.hangs)
        return {
            "state": state,
            "group_rank": view.group_rank if state == "running" else None,
            "ranks": ranks,
            "restarts": view.restarts,
            "hangs": hangs,
            "failures": [
                {"attempt": first + i, "cause": normalize_cause(c)} for i, c in enumerate(causes)
            ],
        }

    def latest(self) -> Any:
        """The latest document (sampled now when no backend is configured)."""
        return self.sensor.latest if self._backend is not None else self.sensor.sample()

    def exchange_backend(self) -> Any:
        """The backend the job-wide verdict exchanges use; None without ``--supervisor``.

        A connection of its own: a node waiting for the other nodes' evidence must not hold up
        the sensor's documents, which share the first connection's lock. When it cannot be
        opened (the backend is down at this round's start) the round exchanges through its own
        store, logged, and the next round tries again.
        """
        if self._url is None:
            return None
        if self._exchange is None:
            from resiliency.supervisor import SupervisorError, backend_from_url  # noqa: PLC0415

            try:
                self._exchange = backend_from_url(self._url)
            except SupervisorError as exc:
                logger.error(
                    "supervisor: cannot connect to %s for the job-wide verdicts (%s); this "
                    "round exchanges them through the round's store",
                    self._url,
                    exc,
                )
        return self._exchange

    # -- intents (sensor thread -> agent loop) ---------------------------------------------------
    def _on_intent(self, intent: Any) -> None:
        with self._lock:
            self._intent = intent

    def take_request(self) -> SupervisorRequest | None:
        """The controller's newest intent not yet taken (the agent's loop carries it out)."""
        with self._lock:
            intent, self._intent = self._intent, None
        if intent is None:
            return None
        action = intent.action if intent.action in ("exclude", "shutdown") else "restart"
        return SupervisorRequest(action, f"supervisor ({intent.policy}): {intent.reason}")

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start publishing and serving."""
        host, port = self._status
        if port is not None:
            from resiliency.supervisor import start_status_server  # noqa: PLC0415

            self._server = start_status_server(self.latest, port, host)
        if self._backend is not None:
            self.sensor.start()
            logger.info(
                "supervisor: node %s publishes to %s every %.2f s",
                self.node,
                self._backend.url,
                self.sensor.interval,
            )

    def stop(self) -> None:
        """Publish the final state, stop serving, close the backend."""
        if self._exchange is not None:
            self._exchange.close()
        if self._backend is not None:
            self.sensor.stop(final=True)
            self._backend.close()
        else:
            self.sensor.stop(final=False)
        if self._server is not None:
            self._server.close()


def start_supervision(
    args: argparse.Namespace, view: Callable[[], NodeView], monitors: MonitorSet
) -> Supervision | None:
    """Start supervision when ``--supervisor`` or ``--status-port`` is given; else None.

    Args:
        args: the parsed flags.
        view: returns what the agent shows of this node now.
        monitors: this node's rank monitors.
    """
    if getattr(args, "supervisor", None) is None and getattr(args, "status_port", None) is None:
        return None
    supervision = Supervision(args, view, monitors)
    supervision.start()
    return supervision
