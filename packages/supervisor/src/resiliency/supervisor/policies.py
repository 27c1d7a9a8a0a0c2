"""Controller policies: small, testable rules with hysteresis that turn samples into decisions.

Each policy sees an :class:`Observation` per controller cycle and returns :class:`Decision`
objects. A policy only counts *new* samples (a node's ``seq`` advanced since the previous cycle),
so one stale sample, read twice, never counts twice, and a sample older than ``max_age`` (by
the writer's clock) is never acted on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from resiliency.supervisor.document import NodeStatus
from resiliency.supervisor.errors import PolicyError
from resiliency.supervisor.gpu import CRITICAL_XIDS

__all__ = [
    "Decision",
    "DiagnosisPolicy",
    "GpuHealthPolicy",
    "NodeLostPolicy",
    "NodeView",
    "Observation",
    "Policy",
    "StragglerPolicy",
    "load_policies",
]

logger = logging.getLogger(__name__)

_ACTIVE = ("running", "restarting")


@dataclass(frozen=True)
class NodeView:
    """One live node in a cycle.

    Attributes:
        status: its latest document.
        new: True when ``status`` is a sample the controller had not seen.
        host: the host daemon's latest document for the node, if any.
        host_new: True when ``host`` is new.
    """

    status: NodeStatus
    new: bool
    host: NodeStatus | None = None
    host_new: bool = False


@dataclass(frozen=True)
class Observation:
    """What the controller read in one cycle.

    Attributes:
        nodes: the live nodes by id.
        lost: nodes whose document expired since the previous cycle (their last document).
        ttl: seconds a document lives after its last put (2 intervals).
        now: the controller's wall time.
    """

    nodes: dict[str, NodeView]
    lost: dict[str, NodeStatus] = field(default_factory=dict)
    ttl: float = 0.0
    now: float = field(default_factory=time.time)

    @cached_property
    def _owners(self) -> dict[int, str]:
        return {
            rank: node
            for node, view in self.nodes.items()
            if view.status.state in _ACTIVE
            for rank in view.status.ranks
        }

    def owner_of(self, rank: int) -> str | None:
        """The running node whose workers include global rank ``rank``."""
        return self._owners.get(rank)


@dataclass(frozen=True)
class Decision:
    """One action for one node, with why.

    Attributes:
        node: the node to act on.
        action: ``exclude``, ``restart`` or ``shutdown``.
        policy: the deciding policy's name.
        reason: one line.
        evidence: the samples the decision rests on.
    """

    node: str
    action: str
    policy: str
    reason: str
    evidence: dict[str, Any]


class Policy:
    """Base class: ``decide`` one observation at a time; keep hysteresis state between calls."""

    name = "policy"

    def decide(self, obs: Observation) -> list[Decision]:
        """Return the decisions for this cycle."""
        raise NotImplementedError


def _fresh(view: NodeView, now: float, max_age: float) -> bool:
    return view.new and now - view.status.time <= max_age


class StragglerPolicy(Policy):
    """Exclude a node after ``consecutive`` straggler reports in a row scoring it below
    ``threshold`` (its slowest rank's lowest score of any kind); one report at or above the
    threshold resets the count.

    Args:
        threshold: score below which a report counts against the node (1.0 = as fast as
            expected).
        consecutive: reports in a row needed.
        max_age: a sample older than this (seconds, writer's clock) is not acted on.
    """

    name = "straggler"

    def __init__(self, threshold: float = 0.7, consecutive: int = 3, max_age: float = 60.0):
        if not 0 < threshold <= 1.5 or consecutive < 1:
            raise PolicyError("straggler: threshold must be in (0, 1.5], consecutive >= 1")
        self.threshold = threshold
        self.consecutive = consecutive
        self.max_age = max_age
        self._seen: dict[str, int] = {}
        self._history: dict[str, list[dict[str, Any]]] = {}

    def decide(self, obs: Observation) -> list[Decision]:
        """See :class:`Policy`."""
        decisions = []
        for reporter, view in sorted(obs.nodes.items()):
            status = view.status
            if not _fresh(view, obs.now, self.max_age):
                continue
            if status.straggler_seq <= self._seen.get(reporter, 0) or not status.straggler:
                self._seen[reporter] = max(self._seen.get(reporter, 0), status.straggler_seq)
                continue
            self._seen[reporter] = status.straggler_seq
            worst: dict[str, tuple[float, int, str]] = {}
            for rank, kinds in status.straggler.items():
                owner = obs.owner_of(rank)
                if owner is None or not kinds:
                    continue
                kind, score = min(kinds.items(), key=lambda kv: kv[1])
                if owner not in worst or score < worst[owner][0]:
                    worst[owner] = (score, rank, kind)
            for owner, (score, rank, kind) in sorted(worst.items()):
                history = self._history.setdefault(owner, [])
                if score >= self.threshold:
                    history.clear()
                    continue
                history.append(
                    {
                        "reporter": reporter,
                        "report": status.straggler_seq,
                        "rank": rank,
                        "kind": kind,
                        "score": round(score, 4),
                    }
                )
                if len(history) >= self.consecutive:
                    evidence = {"threshold": self.threshold, "reports": list(history)}
                    history.clear()
                    decisions.append(
                        Decision(
                            owner,
                            "exclude",
                            self.name,
                            f"{self.consecutive} straggler reports in a row below {self.threshold} "
                            f"(last: rank {rank} {kind} score {score:.3f})",
                            evidence,
                        )
                    )
        return decisions


class GpuHealthPolicy(Policy):
    """Exclude a node at once on an uncorrectable ECC error or a critical XID in a fresh sample
    (from its launcher or its host daemon). Throttling is reported in the status, not acted on.

    Args:
        xids: the XIDs that exclude a node.
        ecc: exclude on uncorrectable ECC errors.
        max_age: a sample older than this (seconds, writer's clock) is not acted on.
    """

    name = "gpu_health"

    def __init__(
        self, xids: frozenset[int] = CRITICAL_XIDS, ecc: bool = True, max_age: float = 60.0
    ) -> None:
        self.xids = frozenset(int(x) for x in xids)
        self.ecc = ecc
        self.max_age = max_age

    def decide(self, obs: Observation) -> list[Decision]:
        """See :class:`Policy`."""
        decisions = []
        for node, view in sorted(obs.nodes.items()):
            samples = [view.status] if _fresh(view, obs.now, self.max_age) else []
            if view.host is not None and view.host_new:
                samples.append(view.host)
            for status in samples:
                bad = [
                    {
                        "gpu": d.index,
                        "ecc_uncorrectable": d.ecc_uncorrectable,
                        "xid": sorted(set(d.xid) & self.xids),
                    }
                    for d in status.gpu
                    if (self.ecc and d.ecc_uncorrectable > 0) or set(d.xid) & self.xids
                ]
                if bad and view.status.state in (*_ACTIVE, "waiting"):
                    what = ", ".join(
                        f"GPU {b['gpu']}: "
                        + (
                            f"{b['ecc_uncorrectable']} uncorrectable ECC"
                            if b["ecc_uncorrectable"]
                            else f"XID {b['xid']}"
                        )
                        for b in bad
                    )
                    evidence = {"sample_seq": status.seq, "sample_time": status.time, "gpus": bad}
                    decisions.append(Decision(node, "exclude", self.name, what, evidence))
                    break
        return decisions


class DiagnosisPolicy(Policy):
    """Act on the launchers' failure verdicts (the ``diagnosis`` events of the goodput ledger,
    which each node's sensor publishes), not on a copy of their rules.

    One owner per decision: the launcher decides restart, restart without its node, or stop
    (its stop rules, ``--ft-max-no-progress-cycles``); the supervisor adds no intent for those.
    It acts where a launcher cannot: a verdict of a class in ``exclude_classes`` (GPU hardware,
    by default) names culprit nodes, and a named node that did not leave by itself (its own
    launcher decided ``restart_without_node``) is excluded, whichever node's launcher named it.
    Every verdict read is logged with the node that reached it.

    Args:
        exclude_classes: failure classes whose culprit nodes are excluded.
    """

    name = "diagnosis"

    def __init__(self, exclude_classes: tuple[str, ...] | list[str] = ("gpu_hardware",)) -> None:
        if isinstance(exclude_classes, str):
            raise PolicyError("diagnosis: exclude_classes is a list of failure classes")
        self.exclude_classes = frozenset(str(c) for c in exclude_classes)
        self._seen: dict[tuple[str, int], int] = {}
        self._groups: dict[str, str] = {}

    def decide(self, obs: Observation) -> list[Decision]:
        """See :class:`Policy`."""
        for node, view in obs.nodes.items():
            if view.status.state == "running" and view.status.group_rank is not None:
                # The culprits are named by group rank: remember whose it was in the last
                # round (a failed round's verdict arrives after it ended).
                self._groups[str(view.status.group_rank)] = node
        decisions = []
        for node, view in sorted(obs.nodes.items()):
            key = (node, view.status.pid)  # a new launcher counts its verdicts from 1 again
            for verdict in view.status.diagnoses:
                seq = int(verdict.get("seq", 0))
                if seq <= self._seen.get(key, 0):
                    continue
                self._seen[key] = seq
                decisions.extend(self._verdict(node, verdict, obs))
        return decisions

    def _verdict(self, node: str, verdict: dict[str, Any], obs: Observation) -> list[Decision]:
        what = _describe(verdict)
        decision = verdict.get("decision")
        logger.info(
            "diagnosis of node %s's launcher (cycle %s): %s; its decision: %s",
            node,
            verdict.get("cycle"),
            what,
            decision,
        )
        if decision == "stop":
            logger.warning(
                "node %s's launcher stops the job (rule %s): %s; the launcher owns this "
                "decision, the supervisor adds no intent",
                node,
                verdict.get("rule"),
                what,
            )
        if verdict.get("cls") not in self.exclude_classes:
            return []
        out = []
        for group in verdict.get("culprit_nodes", []):
            target = self._groups.get(str(group))
            if target is None:
                logger.warning(
                    "diagnosis of node %s names node %s (group rank) as culprit, which no "
                    "running node was; not acted on",
                    node,
                    group,
                )
                continue
            if target == node and decision == "restart_without_node":
                continue  # its own launcher takes it out of the job already
            view = obs.nodes.get(target)
            if view is None or view.status.state not in (*_ACTIVE, "waiting"):
                continue
            evidence = {"diagnosed_by": node, "culprit_group_rank": str(group), **verdict}
            reason = f"diagnosis by node {node}'s launcher: {what}"
            out.append(Decision(target, "exclude", self.name, reason, evidence))
        return out


def _describe(verdict: dict[str, Any]) -> str:
    ranks = ", ".join(str(r) for r in verdict.get("culprit_ranks", [])) or "none"
    nodes = ", ".join(str(n) for n in verdict.get("culprit_nodes", [])) or "none"
    cause = verdict.get("cause")
    return f"{verdict.get('cls')} (ranks {ranks}, nodes {nodes})" + (f": {cause}" if cause else "")


class NodeLostPolicy(Policy):
    """A node whose document expired while it was running is lost (a dead launcher or host):
    restart the workers of the nodes still running so that the group re-forms without it.

    Args:
        restart_survivors: write restart intents for the running nodes (False: only report).
    """

    name = "node_lost"

    def __init__(self, restart_survivors: bool = True) -> None:
        self.restart_survivors = restart_survivors

    def decide(self, obs: Observation) -> list[Decision]:
        """See :class:`Policy`."""
        lost = {n: s for n, s in obs.lost.items() if s.state in _ACTIVE}
        if not lost or not self.restart_survivors:
            return []
        evidence = {
            "lost": {
                n: {
                    "last_seq": s.seq,
                    "last_seen_s_ago": round(obs.now - s.time, 3),
                    "state": s.state,
                }
                for n, s in sorted(lost.items())
            },
            "ttl_s": obs.ttl,
        }
        reason = "node(s) " + ", ".join(sorted(lost)) + " lost: document expired"
        return [
            Decision(node, "restart", self.name, reason, evidence)
            for node, view in sorted(obs.nodes.items())
            if view.status.state == "running"
        ]


_FACTORIES: dict[str, Any] = {
    "straggler": StragglerPolicy,
    "gpu_health": GpuHealthPolicy,
    "diagnosis": DiagnosisPolicy,
    "node_lost": NodeLostPolicy,
}


def load_policies(source: str | Path | dict[str, Any] | None) -> tuple[list[Policy], float]:
    """Build the policies from a YAML file (or its parsed dict) and return the cycle interval.

    The file::

        interval: 5.0            # controller cycle, seconds
        policies:
          straggler: {threshold: 0.7, consecutive: 3}
          gpu_health: {ecc: true, xids: [48, 79, 94, 95]}
          diagnosis: {exclude_classes: [gpu_hardware]}
          node_lost: {restart_survivors: true}

    A policy left out is off; ``None`` (no file) turns every policy on with its defaults.

    Raises:
        PolicyError: unknown policy or setting, or an unreadable file.
    """
    if source is None:
        return [factory() for factory in _FACTORIES.values()], 5.0
    if isinstance(source, dict):
        doc = source
    else:
        try:
            doc = yaml.safe_load(Path(source).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise PolicyError(f"cannot read the policy file {source}: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) - {"interval", "policies"}:
        raise PolicyError("a policy file has the keys 'interval' and 'policies' only")
    policies = []
    for name, settings in (doc.get("policies") or {}).items():
        if name == "repeated_failure":
            raise PolicyError(
                "the repeated_failure policy is gone: the launcher stops a job that fails the "
                "same way without progress (--ft-max-no-progress-cycles, default 3), and the "
                "supervisor's 'diagnosis' policy acts on its verdicts; remove repeated_failure "
                "from the policy file"
            )
        if name not in _FACTORIES:
            raise PolicyError(f"unknown policy {name!r}; known: {', '.join(_FACTORIES)}")
        kwargs = dict(settings or {})
        if "xids" in kwargs:
            kwargs["xids"] = frozenset(kwargs["xids"])
        if isinstance(kwargs.get("exclude_classes"), list):
            kwargs["exclude_classes"] = tuple(kwargs["exclude_classes"])
        try:
            policies.append(_FACTORIES[name](**kwargs))
        except TypeError as exc:
            raise PolicyError(f"policy {name!r}: {exc}") from None
    interval = float(doc.get("interval", 5.0))
    if interval <= 0:
        raise PolicyError("interval must be > 0 seconds")
    return policies, interval
