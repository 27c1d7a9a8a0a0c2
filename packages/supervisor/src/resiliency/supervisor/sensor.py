"""The node sensor: one document per interval into the backend, and the node's intents back.

A :class:`NodeSensor` runs one thread. Each interval it builds a
:class:`~resiliency.supervisor.document.NodeStatus` from a *probe* (a callable returning what
the owner knows: the launcher's state, restarts, hangs, per-rank heartbeat age and section), the
goodput ledger (steps, checkpoints, straggler reports, the launcher's failure diagnoses) and
NVML, and puts it with a ttl of two intervals: ONE write per interval. Between two writes it
waits for a change of the node's intent key (an etcd watch, or a TCPStore poll) and hands a new
intent to ``on_intent``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from resiliency.goodput import DIR_ENV
from resiliency.supervisor._ledger import LedgerTail
from resiliency.supervisor.backend import Backend
from resiliency.supervisor.document import NodeStatus, keys_for
from resiliency.supervisor.errors import SupervisorError
from resiliency.supervisor.generation import read_generation
from resiliency.supervisor.gpu import GpuWatch
from resiliency.supervisor.intents import Intent, refusal

__all__ = ["DEFAULT_INTERVAL_S", "NODE_ID_ENV", "NodeSensor", "Probe"]

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
#: A node's id for the supervisor when no --node / --node-id is given (else the host name).
#: ft-launcher reads the same variable and keeps its own copy (the supervisor is its extra):
#: tests/integration/test_contracts.py checks that both agree.
NODE_ID_ENV = "RESILIENCY_NODE_ID"
#: A document lives this many intervals after its last put.
TTL_INTERVALS = 2.0

#: Returns the fields of NodeStatus the owner knows (state, ranks, restarts, hangs, failures...).
Probe = Callable[[], dict[str, Any]]


class NodeSensor:
    """Publishes a node's status every ``interval`` seconds and watches its intents.

    Args:
        backend: where to publish (None: sample only, e.g. for a status endpoint alone).
        node: the node's id (its key).
        probe: returns the owner's fields of :class:`NodeStatus` (at least ``state``).
        interval: seconds between two publications.
        ledger_dir: the goodput ledger directory to follow (None: ``RESILIENCY_GOODPUT_DIR``,
            and no ledger when that is unset).
        gpu: the GPU watchdogs (None: a new :class:`GpuWatch`; pass ``False`` for none).
        on_intent: called (on the sensor's thread) with every new intent for this node.
        host_daemon: publish under ``hosts/`` instead of ``nodes/``.
    """

    def __init__(
        self,
        backend: Backend | None,
        node: str,
        probe: Probe,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        ledger_dir: str | None = None,
        gpu: GpuWatch | bool | None = None,
        on_intent: Callable[[Intent], None] | None = None,
        host_daemon: bool = False,
    ) -> None:
        if interval <= 0:
            raise SupervisorError(f"the sensor interval must be > 0 s, got {interval}")
        self.backend = backend
        self.node = node
        self.interval = float(interval)
        self._probe = probe
        keys = keys_for(backend.namespace if backend is not None else "resiliency/local/")
        self.key = keys.host(node) if host_daemon else keys.node(node)
        self._intent_key = keys.intent(node)
        directory = ledger_dir if ledger_dir is not None else os.environ.get(DIR_ENV)
        self._ledger = LedgerTail(directory) if directory else None
        self._gpu: GpuWatch | None = GpuWatch() if gpu is None or gpu is True else gpu or None
        self._on_intent = on_intent
        self._seq = 0
        self._group: str | None = None  # the node's group rank in its latest round
        self._intent_raw: bytes | None = None
        self.intent_done = 0
        self.latest: NodeStatus | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = 0.0

    # -- one sample ----------------------------------------------------------------------------
    def sample(self) -> NodeStatus:
        """Build the current document (no I/O to the backend)."""
        fields = dict(self._probe())
        ranks = {int(r) for r in fields.get("ranks", {})}
        if fields.get("group_rank") is not None:
            # A failed round's diagnosis is written after the round ended (group_rank None by
            # then), under the group rank the node had in it.
            self._group = str(fields["group_rank"])
        if self._ledger is not None:
            self._ledger.poll(ranks, node=self._group)
            fields.setdefault("step", self._ledger.step)
            fields.setdefault("checkpoint_age", self._ledger.checkpoint_age())
            fields.setdefault("straggler_seq", self._ledger.straggler_seq)
            fields.setdefault("straggler", self._ledger.straggler)
            fields.setdefault("diagnoses", self._ledger.diagnoses)
        if self._gpu is not None:
            fields["gpu"] = self._gpu.sample()
            fields["gpu_note"] = self._gpu.note
        self._seq += 1
        fields.setdefault("intent_done", self.intent_done)
        return NodeStatus(
            node=self.node,
            seq=self._seq,
            time=time.time(),
            interval=self.interval,
            host=socket.gethostname(),
            pid=os.getpid(),
            **fields,
        )

    def publish_once(self) -> NodeStatus:
        """Sample and put the document (one write)."""
        if self.backend is None:
            raise SupervisorError("this sensor has no backend to publish to")
        status = self.sample()
        self.backend.put(self.key, status.to_json(), ttl=TTL_INTERVALS * self.interval)
        self.latest = status
        return status

    def check_intent(self, timeout: float = 0.0) -> Intent | None:
        """Wait up to ``timeout`` for a new intent; hand it to ``on_intent`` and return it."""
        if self.backend is None:
            return None
        raw = self.backend.wait_for_change(self._intent_key, self._intent_raw, timeout)
        if raw == self._intent_raw or raw is None:
            self._intent_raw = raw
            return None
        self._intent_raw = raw
        try:
            intent = Intent.from_json(raw)
        except SupervisorError as exc:
            logger.error("ignoring an invalid intent for node %s: %s", self.node, exc)
            return None
        if intent.id <= self.intent_done:
            return None
        try:
            why = refusal(
                intent,
                job=self.backend.url.job,
                node=self.node,
                generation=read_generation(self.backend),
            )
        except SupervisorError as exc:
            why = f"the job's generation cannot be read: {exc}"
        if why is not None:
            logger.error(
                "supervisor: refusing intent %d (%s) for node %s at %s: %s; not acted on",
                intent.id,
                intent.action,
                self.node,
                self._intent_key,
                why,
            )
            return None
        self.intent_done = intent.id
        logger.warning(
            "supervisor intent %d for node %s: %s (%s: %s; %s, generation %d)",
            intent.id,
            self.node,
            intent.action,
            intent.policy,
            intent.reason,
            intent.issuer,
            intent.generation,
        )
        if self._on_intent is not None:
            self._on_intent(intent)
        return intent

    # -- the thread ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start publishing on a daemon thread (the first document is put at once)."""
        if self._thread is not None or self.backend is None:
            return
        try:  # an intent written before this launcher started is history, not an order
            self._intent_raw = self.backend.get(self._intent_key)
            if self._intent_raw is not None:
                self.intent_done = Intent.from_json(self._intent_raw).id
        except SupervisorError as exc:
            logger.warning("cannot read the current intent of node %s: %s", self.node, exc)
        self._thread = threading.Thread(target=self._run, name="supervisor-sensor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_put = time.monotonic()
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_put:
                    next_put = time.monotonic() + self.interval
                    self.publish_once()
                self.check_intent(timeout=max(0.0, next_put - time.monotonic()))
            except Exception as exc:  # the backend is down: keep trying, log once a minute
                now = time.monotonic()
                if now - self._last_error > 60:
                    self._last_error = now
                    logger.warning("supervisor sensor of node %s: %s", self.node, exc)
                self._stop.wait(min(self.interval, 1.0))

    def stop(self, final: bool = True) -> None:
        """Stop the thread; put one last document first when ``final``.

        Args:
            final: publish the final state (e.g. ``excluded``) before stopping.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 15.0)
            self._thread = None
        if final and self.backend is not None:
            try:
                self.publish_once()
            except Exception as exc:
                logger.warning("could not publish the final state of node %s: %s", self.node, exc)
        if self._gpu is not None:
            self._gpu.close()
