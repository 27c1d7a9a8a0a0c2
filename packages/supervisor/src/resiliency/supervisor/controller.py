"""The controller: one per job. Reads every node's document each cycle, runs the policies, and
writes their decisions as intents, each logged with its evidence and recorded as a goodput
``supervisor_decision`` event.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from resiliency.supervisor.backend import Backend
from resiliency.supervisor.document import NodeStatus, keys_for
from resiliency.supervisor.errors import StaleGenerationError, SupervisorError
from resiliency.supervisor.generation import Generation, claim_generation, default_issuer
from resiliency.supervisor.intents import Intent, write_intent
from resiliency.supervisor.policies import Decision, NodeView, Observation, Policy

__all__ = ["Controller", "CycleStats"]

logger = logging.getLogger(__name__)

#: An unacknowledged intent blocks another for the same node this long.
PENDING_S = 30.0
#: Actions a launcher is given once (until it is a new launcher process).
_FINAL = ("exclude", "shutdown")


@dataclass(frozen=True)
class CycleStats:
    """What one controller cycle did.

    Attributes:
        nodes: live node documents read.
        decisions: decisions taken.
        intents: intents written.
        seconds: how long the cycle took.
    """

    nodes: int
    decisions: list[Decision]
    intents: list[Intent]
    seconds: float


class Controller:
    """Turns the nodes' documents into intents.

    Args:
        backend: the job's backend.
        policies: the policies, asked in order each cycle.
        interval: seconds between cycles.
        recorder: a goodput recorder (None: ``resiliency.goodput.get_recorder()``).
        issuer: names this controller in its intents (None: ``controller@HOST:PID``).

    Attributes:
        generation: the job's generation this controller claimed (None until its first
            cycle). A newer controller's claim makes this one stale: its next intent raises
            :class:`~resiliency.supervisor.errors.StaleGenerationError` and :meth:`run` ends.
    """

    def __init__(
        self,
        backend: Backend,
        policies: list[Policy],
        *,
        interval: float = 5.0,
        recorder: object | None = None,
        issuer: str | None = None,
    ) -> None:
        self.backend = backend
        self.policies = policies
        self.interval = interval
        self.keys = keys_for(backend.namespace)
        if recorder is None:
            from resiliency.goodput import get_recorder  # noqa: PLC0415

            recorder = get_recorder()
        self._recorder = recorder
        self._seen: dict[str, int] = {}
        self._host_seen: dict[str, int] = {}
        self._last: dict[str, NodeStatus] = {}
        self._pending: dict[str, tuple[Intent, float, int]] = {}
        self.decisions: list[Decision] = []
        self._stop = threading.Event()
        self.issuer = issuer or default_issuer()
        self.generation: Generation | None = None

    def claim(self) -> Generation:
        """Claim the job's next generation (done by the first :meth:`cycle` when not yet)."""
        self.generation = claim_generation(self.backend, self.issuer)
        logger.info(
            "controller %s acts for job %s as generation %d",
            self.issuer,
            self.backend.url.job,
            self.generation.number,
        )
        return self.generation

    def _read(self, prefix: str) -> dict[str, NodeStatus]:
        out = {}
        for key, raw in self.backend.list(prefix).items():
            try:
                status = NodeStatus.from_json(raw)
            except SupervisorError as exc:
                logger.warning("ignoring %s: %s", key, exc)
                continue
            out[key[len(prefix) :]] = status
        return out

    def observe(self) -> Observation:
        """Read every document once and mark which samples are new."""
        docs = self._read(self.keys.nodes)
        hosts = self._read(self.keys.hosts)
        views = {}
        for node, status in docs.items():
            previous = self._last.get(node)
            if previous is None or previous.state != status.state:
                # Once per change, not per cycle: what the controller last saw of each node.
                logger.info("node %s: %s (sample %d)", node, status.state, status.seq)
            host = hosts.get(node)
            views[node] = NodeView(
                status,
                new=status.seq != self._seen.get(node),
                host=host,
                host_new=host is not None and host.seq != self._host_seen.get(node),
            )
            self._seen[node] = status.seq
            if host is not None:
                self._host_seen[node] = host.seq
        for node, host in hosts.items():  # a host daemon without a launcher (yet)
            if node not in views:
                views[node] = NodeView(
                    host, new=False, host=host, host_new=host.seq != self._host_seen.get(node)
                )
                self._host_seen[node] = host.seq
        lost = {n: s for n, s in self._last.items() if n not in docs}
        for node, status in lost.items():
            logger.warning(
                "node %s: its document expired (last sample %d, state %s, %.1f s ago)",
                node,
                status.seq,
                status.state,
                time.time() - status.time,
            )
            self._seen.pop(node, None)
        self._last = docs
        ttl = 2.0 * max((s.interval for s in docs.values()), default=0.0)
        return Observation(views, lost, ttl=ttl)

    def cycle(self) -> CycleStats:
        """Run one cycle: observe, decide, write intents.

        Raises:
            StaleGenerationError: a newer controller claimed the job.
        """
        start = time.perf_counter()
        if self.generation is None:
            self.claim()
        obs = self.observe()
        decisions: list[Decision] = []
        for policy in self.policies:
            decisions.extend(policy.decide(obs))
        intents = []
        for decision in decisions:
            intent = self._act(decision, obs)
            if intent is not None:
                intents.append(intent)
        return CycleStats(len(obs.nodes), decisions, intents, time.perf_counter() - start)

    def _act(self, decision: Decision, obs: Observation) -> Intent | None:
        pending = self._pending.get(decision.node)
        view = obs.nodes.get(decision.node)
        pid = view.status.pid if view is not None else 0
        if pending is not None:
            previous, when, previous_pid = pending
            if (
                previous.action in _FINAL
                and previous.action == decision.action
                and pid == previous_pid
            ):
                # Told to leave or stop already: the same launcher is not told twice.
                logger.debug("node %s: already told to %s", decision.node, previous.action)
                return None
            acked = view is not None and view.status.intent_done >= previous.id
            if not acked and time.monotonic() - when < PENDING_S:
                logger.info(
                    "node %s: intent %d not acted on yet; %s waits",
                    decision.node,
                    previous.id,
                    decision.action,
                )
                return None
        # A stale controller raises here: no log line and no goodput event for a decision it
        # cannot carry out. Otherwise the event is in the ledger before the decision's log line
        # (readers of the log find the event).
        intent = write_intent(
            self.backend,
            decision.node,
            decision.action,
            decision.policy,
            decision.reason,
            decision.evidence,
            generation=self.generation,
        )
        self.decisions.append(decision)
        self._emit(decision)
        logger.warning(
            "supervisor decision: %s node %s (policy %s): %s; evidence: %s",
            decision.action,
            decision.node,
            decision.policy,
            decision.reason,
            json.dumps(decision.evidence, sort_keys=True),
        )
        if intent is None:
            logger.warning("node %s: another controller wrote its intent first", decision.node)
            return None
        self._pending[decision.node] = (intent, time.monotonic(), pid)
        return intent

    def _emit(self, decision: Decision) -> None:
        emit = getattr(self._recorder, "emit", None)
        if emit is None:
            return
        emit(
            "supervisor_decision",
            target=decision.node,
            action=decision.action,
            policy=decision.policy,
            reason=decision.reason,
            evidence=decision.evidence,
        )
        flush = getattr(self._recorder, "flush", None)
        if flush is not None:
            flush()

    def run(self, max_cycles: int | None = None) -> None:
        """Cycle every :attr:`interval` seconds until :meth:`stop` (or ``max_cycles``).

        Raises:
            StaleGenerationError: a newer controller claimed the job (logged first).
        """
        done = 0
        while not self._stop.is_set() and (max_cycles is None or done < max_cycles):
            started = time.monotonic()
            try:
                self.cycle()
            except StaleGenerationError as exc:
                logger.error("controller %s stops: %s", self.issuer, exc)
                raise
            except SupervisorError as exc:
                logger.warning("controller cycle failed: %s", exc)
            done += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def stop(self) -> None:
        """Make :meth:`run` return after the current cycle."""
        self._stop.set()
