"""One failure verdict for the whole job: every node's evidence, exchanged through the store.

One node sees only its own ranks. When rank 2 of node 1 is killed, node 0's ranks fail a few
milliseconds later in their all-reduce ("Connection closed by peer"): judged alone, node 0 would
blame them. When a node's launcher is gone (a lost node), it leaves no evidence at all. So when a
cycle of several nodes fails, as the job-wide hang verdict (:mod:`._job_verdict`) does for hangs:

1. every node that closes the failed cycle publishes its evidence (its failed and hung ranks,
   OOM kills, failed health checks, a preemption) under its node rank; a node whose launcher got
   the scheduler's SIGTERM publishes that it was preempted before it stops;
2. node 0 waits, bounded, for every node's evidence, reads it in one store operation, merges it
   (a node that sent nothing in time is a lost node) and classifies it with the one table
   (:func:`~resiliency.launcher.failure_classes.classify`), then publishes the verdict;
3. every other node reads that verdict; a node that sees none in time (node 0 stopped or gone,
   or its store unreachable) classifies what it has itself.

The verdict names the node that records it and decides: the lowest culprit node that took part
(the node whose rank failed decides, as on one node), else node 0. At most four store operations
per node (publish; node 0: wait, one read of every node's evidence, publish the verdict; the
others: wait, read it). One exchange per round, in the round's store namespace.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

from resiliency.launcher._shared_state import SharedRoundState, StoreWaitTimeoutError, wait_keys
from resiliency.launcher.failure_classes import (
    CycleEvidence,
    FailureClass,
    FailureVerdict,
    RankEvidence,
    classify,
)

__all__ = [
    "JobFailureExchange",
    "JobFailureVerdict",
    "decode_cycle_evidence",
    "encode_cycle_evidence",
    "merge_evidence",
    "publish_preempted",
]

logger = logging.getLogger(__name__)

_EVIDENCE = "ft/failure/evidence/"  # + node rank: JSON, that node's CycleEvidence
_VERDICT = "ft/failure/verdict"  # JSON: node 0's verdict over every node's evidence
_JUDGE = 0
#: How much longer than the judge's wait for evidence another node waits for the verdict.
VERDICT_SLACK_S = 5.0
_MAX_BYTES = 1 << 20  # a node's evidence is a few KB: a bigger message is not evidence
_RANK_FIELDS = set(RankEvidence.__dataclass_fields__)


def encode_cycle_evidence(evidence: CycleEvidence) -> str:
    """The JSON a node publishes: its whole :class:`CycleEvidence`."""
    data = asdict(evidence)
    data["ranks"] = [asdict(r) for _, r in sorted(evidence.ranks.items())]
    return json.dumps(data, separators=(",", ":"))


def decode_cycle_evidence(data: bytes | str) -> CycleEvidence:
    """Validate and decode what :func:`encode_cycle_evidence` wrote.

    Raises:
        ValueError: the data is not well-formed evidence.
    """
    if len(data) > _MAX_BYTES:
        raise ValueError(f"{len(data)} bytes of evidence")
    raw: Any = json.loads(data)
    try:
        ranks = {}
        for item in raw["ranks"]:
            if not isinstance(item, dict) or set(item) - _RANK_FIELDS:
                raise ValueError(f"not a rank's evidence: {item!r}")
            rank = RankEvidence(**item)
            if not isinstance(rank.rank, int) or not isinstance(rank.node, int):
                raise ValueError(f"a rank's evidence needs integer 'rank' and 'node': {item!r}")
            ranks[rank.rank] = rank
        return CycleEvidence(
            node=int(raw["node"]),
            attempt=int(raw["attempt"]),
            ranks=ranks,
            hang_culprits=tuple(int(r) for r in raw["hang_culprits"]),
            common_frame=raw["common_frame"],
            oom_kills=int(raw["oom_kills"]),
            health=tuple(str(h) for h in raw["health"]),
            preempted=raw["preempted"],
            preempted_nodes=tuple(int(n) for n in raw["preempted_nodes"]),
            lost_nodes=tuple(int(n) for n in raw["lost_nodes"]),
            dead_monitors=tuple(int(r) for r in raw["dead_monitors"]),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed evidence: {exc!r}") from exc


def merge_evidence(
    judge: int, attempt: int, nodes: list[CycleEvidence], lost: tuple[int, ...]
) -> CycleEvidence:
    """Every node's evidence as one cycle's, judged from ``judge``.

    Args:
        judge: the node that judges (the merged evidence's node).
        attempt: the judge's restart count.
        nodes: the evidence each node sent.
        lost: nodes that sent nothing in time.
    """
    ranks: dict[int, RankEvidence] = {}
    for ev in nodes:
        ranks.update(ev.ranks)
    preempted = [ev for ev in nodes if ev.preempted]
    culprits = next((ev.hang_culprits for ev in nodes if ev.hang_culprits), ())
    return CycleEvidence(
        node=judge,
        attempt=attempt,
        ranks=ranks,
        hang_culprits=culprits,
        common_frame=next((ev.common_frame for ev in nodes if ev.common_frame), None),
        oom_kills=sum(ev.oom_kills for ev in nodes),
        # A failed health check names its node: only its node leaves.
        health=tuple(f"node {ev.node}: {h}" for ev in nodes for h in ev.health),
        preempted="; ".join(f"node {ev.node}: {ev.preempted}" for ev in preempted) or None,
        preempted_nodes=tuple(sorted({n for ev in preempted for n in ev.preempted_nodes})),
        lost_nodes=lost,
        dead_monitors=tuple(sorted({r for ev in nodes for r in ev.dead_monitors})),
    )


@dataclass(frozen=True)
class JobFailureVerdict:
    """The job's verdict on a failed cycle and the node that records it and decides.

    Attributes:
        verdict: the class, culprits, cause and evidence.
        recorder: the node that records the ``diagnosis`` event and carries out the decision.
    """

    verdict: FailureVerdict
    recorder: int

    def to_json(self) -> str:
        """The verdict as node 0 publishes it."""
        v = self.verdict
        data = {
            "cls": v.cls.value,
            "culprit_ranks": list(v.culprit_ranks),
            "culprit_nodes": list(v.culprit_nodes),
            "cause": v.cause,
            "rule": v.rule,
            "evidence": v.evidence,
            "recorder": self.recorder,
        }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: bytes | str) -> JobFailureVerdict:
        """Validate and decode :meth:`to_json`'s output.

        Raises:
            ValueError: the data is not a well-formed verdict.
        """
        raw: Any = json.loads(data)
        try:
            verdict = FailureVerdict(
                cls=FailureClass(raw["cls"]),
                culprit_ranks=tuple(int(r) for r in raw["culprit_ranks"]),
                culprit_nodes=tuple(int(n) for n in raw["culprit_nodes"]),
                cause=str(raw["cause"]),
                rule=str(raw["rule"]),
                evidence=dict(raw["evidence"]),
            )
            return cls(verdict, int(raw["recorder"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed verdict: {exc!r}") from exc


def _recorder(verdict: FailureVerdict, present: list[int]) -> int:
    took_part = [n for n in verdict.culprit_nodes if n in present]
    return min(took_part) if took_part else _JUDGE


def publish_preempted(shared: SharedRoundState, evidence: CycleEvidence) -> None:
    """A node whose launcher got the scheduler's SIGTERM says so before it stops (best effort:
    the round's store may be gone with its host)."""
    try:
        shared.exchange.set(f"{_EVIDENCE}{shared.rank}", encode_cycle_evidence(evidence))
    except RuntimeError as exc:
        logger.warning("could not tell the other nodes this node is preempted: %s", exc)


class JobFailureExchange:
    """This node's side of one round's job-wide failure verdict.

    Args:
        shared: the round's state (its store, this node's rank and the number of nodes).
        wait_s: the longest the judge waits for the other nodes' evidence.
    """

    def __init__(self, shared: SharedRoundState, wait_s: float) -> None:
        self._shared = shared
        self._wait_s = wait_s
        self.used = False

    def verdict(self, local: CycleEvidence) -> JobFailureVerdict:
        """Publish this node's evidence and return the job's verdict (node 0's, or this node's
        own judgement when node 0's does not come in time)."""
        self.used = True
        shared = self._shared
        try:
            shared.exchange.set(f"{_EVIDENCE}{shared.rank}", encode_cycle_evidence(local))
            if shared.rank != _JUDGE:
                return self._read_verdict()
            verdict = self._judge(local)
            shared.exchange.set(_VERDICT, verdict.to_json())
            return verdict
        except StoreWaitTimeoutError as exc:
            logger.warning(
                "job-wide failure verdict: %s (node 0's launcher is stopped, slow or gone); "
                "judging this node's evidence",
                exc,
            )
        except (RuntimeError, ValueError) as exc:
            logger.error(
                "job-wide failure verdict: the round's store failed (%s); its host, node 0, "
                "may be gone; judging this node's evidence",
                exc,
            )
            others = tuple(n for n in range(shared.world) if n != shared.rank)
            local = replace(local, lost_nodes=others)
        return JobFailureVerdict(classify(local), shared.rank)

    def _read_verdict(self) -> JobFailureVerdict:
        store = self._shared.exchange
        wait_keys(store, [_VERDICT], self._wait_s + VERDICT_SLACK_S, "node 0's failure verdict")
        return JobFailureVerdict.from_json(store.get(_VERDICT))

    def _judge(self, local: CycleEvidence) -> JobFailureVerdict:
        shared = self._shared
        keys = {node: f"{_EVIDENCE}{node}" for node in range(shared.world)}
        present = list(keys)
        try:
            wait_keys(shared.exchange, list(keys.values()), self._wait_s, "every node's evidence")
        except StoreWaitTimeoutError as exc:
            present = [n for n, key in keys.items() if shared.exchange.check([key])]
            logger.warning(
                "job-wide failure verdict: %s: no evidence from node(s) %s (their launcher is "
                "stopped, slow or gone; check their logs); judging without them",
                exc,
                ",".join(str(n) for n in keys if n not in present),
            )
        values = shared.exchange.multi_get([keys[n] for n in present]) if present else []
        nodes: list[CycleEvidence] = []
        for node, data in zip(present, values, strict=True):
            try:
                nodes.append(decode_cycle_evidence(data))
            except ValueError as exc:
                logger.error("job-wide failure verdict: dropped node %d's evidence: %s", node, exc)
        lost = tuple(n for n in keys if n not in present)
        verdict = classify(merge_evidence(shared.rank, local.attempt, nodes, lost))
        return JobFailureVerdict(verdict, _recorder(verdict, present))
