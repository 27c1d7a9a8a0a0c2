"""One diagnosis per failed cycle: evidence, class, decision, the ledger's ``diagnosis`` event.

The agent calls :func:`diagnose_cycle` when it closes a failed cycle. It gathers this node's
evidence (:mod:`~resiliency.launcher._failure_evidence`), classifies it
(:mod:`~resiliency.launcher.failure_classes`), asks the stop rules
(:mod:`~resiliency.launcher.stop_rules`), logs one ``diagnosis`` line, records the ``diagnosis``
goodput event and carries out a stop or a restart without this node. A node diagnoses a cycle
when one of its ranks failed or a culprit of the (job-wide) hang verdict is one of its ranks: the
node that saw the failure decides, the others follow its shutdown as after a
``ShutdownWorkload``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.ft import FaultToleranceConfig
from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher._cycle import Cycle
from resiliency.launcher._failure_evidence import cycle_evidence, oom_kill_count
from resiliency.launcher._goodput_events import GoodputEvents
from resiliency.launcher._job_progress import highest_step
from resiliency.launcher._node_handle import NodeHandle
from resiliency.launcher._workload_control import stop_the_job
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.failure_classes import FailureClass, FailureVerdict, classify
from resiliency.launcher.stop_rules import Action, StopDecision, StopRules

__all__ = ["CycleDiagnosis", "diagnose_cycle", "stop_rules_for"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CycleDiagnosis:
    """What the diagnosis of one failed cycle found and did.

    Attributes:
        record: the verdict and decision, for ``--exit-status-file``'s ``diagnoses``.
        outcome: how the job ended on this node when the diagnosis ended it (the workers are
            stopped); None when the restart policy goes on as it decided.
    """

    record: dict[str, Any]
    outcome: Outcome | None


def stop_rules_for(cfg: FaultToleranceConfig) -> StopRules:
    """The stop rules with the monitors' configuration."""
    return StopRules(
        0, cfg.max_no_progress_cycles, cfg.restart_storm_restarts, cfg.restart_storm_window
    )


def _verdict(
    node: int,
    cycle: Cycle,
    attempt: int,
    failures: Mapping[int, ProcessFailure],
    health: tuple[str, ...],
) -> FailureVerdict | None:
    start, now = cycle.oom_at_start, oom_kill_count()
    evidence = cycle_evidence(
        node=node,
        attempt=attempt,
        failures=failures,
        hangs=cycle.diagnosis.hangs,
        verdict=cycle.hang_verdict,
        oom_kills=(now - start) if start is not None and now is not None else 0,
        health=health,
        signalled=cycle.signalled_ranks(),
    )
    verdict = classify(evidence)
    if verdict.cls is FailureClass.UNKNOWN:
        return None  # nothing failed here: the node that saw the failure diagnoses it
    if verdict.culprit_nodes and node not in verdict.culprit_nodes:
        return None  # a hang whose culprit is on another node: that node decides
    return verdict


def diagnose_cycle(
    node: NodeHandle,
    cycle: Cycle,
    *,
    attempt: int,
    failures: Mapping[int, ProcessFailure],
    health: tuple[str, ...],
    rules: StopRules,
    goodput: GoodputEvents,
    give_up: bool,
) -> CycleDiagnosis | None:
    """Diagnose the failed cycle that just ended on this node, record it and act on it.

    Args:
        node: this node (stopped, or the job stopped, when the diagnosis says so).
        cycle: what the cycle saw (hangs, hang verdict, OOM count at its start).
        attempt: the cycle's restart count.
        failures: torch's failures of this node's workers, by global rank.
        health: failed node health checks (``name: detail``).
        rules: the stop rules (they remember earlier cycles).
        goodput: where the ``diagnosis`` event goes.
        give_up: the restart policy already gave up (no restarts left): a restart is recorded
            as ``stop``, and the caller ends the job as before.

    Returns:
        The diagnosis, with an outcome when it ended the job on this node (stop, or restart
        without this node); None when nothing failed here that this node should diagnose.
    """
    group_rank = node.group.group_rank or 0
    verdict = _verdict(group_rank, cycle, attempt, failures, health)
    if verdict is None:
        return None
    rules.set_node(group_rank)
    decision = rules.decide(verdict, progress=highest_step(goodput.directory))
    if give_up and decision.action is Action.RESTART:
        decision = StopDecision(Action.STOP, "max_restarts", "no restarts left (--max-restarts)")
    logger.error(
        "diagnosis: %s; decision: %s (%s)",
        *(verdict.summary(), decision.action.value, decision.reason),
    )
    record = {
        "cls": verdict.cls.value,
        "culprit_ranks": list(verdict.culprit_ranks),
        "culprit_nodes": list(verdict.culprit_nodes),
        "cause": verdict.cause,
        "decision": decision.action.value,
        "rule": decision.rule,
    }
    goodput.diagnosis(
        cls=verdict.cls.value,
        culprit_ranks=list(verdict.culprit_ranks),
        culprit_nodes=[str(n) for n in verdict.culprit_nodes],
        decision=decision.action.value,
        evidence={**verdict.evidence, "cause": verdict.cause, "rule": verdict.rule},
        rule=decision.rule,
    )
    if decision.rule == "max_restarts" or decision.action is Action.RESTART:
        return CycleDiagnosis(record, None)
    if decision.action is Action.RESTART_WITHOUT_NODE:
        logger.error("%s; this node leaves the job, the others go on without it", decision.reason)
        if node.shared is not None:
            node.shared.publish_left()
        node.stop()
        return CycleDiagnosis(
            record, Outcome(ExitCode.NODE_EXCLUDED, "node_unhealthy", decision.reason)
        )
    rank = verdict.culprit_ranks[0] if verdict.culprit_ranks else None
    logger.error("stopping the job on every node, no more restarts: %s", decision.reason)
    stop_the_job(node, rank, f"diagnosis: {decision.reason}")
    if decision.rule == "config_first_attempt":
        return CycleDiagnosis(record, Outcome(ExitCode.USAGE, "config_error", decision.reason))
    outcome = Outcome(ExitCode.DIAGNOSED_STOP, f"stopped_{decision.rule}", decision.reason)
    return CycleDiagnosis(record, outcome)
