"""One diagnosis per failed cycle: evidence, class, decision, the ledger's ``diagnosis`` event.

The agent calls :func:`diagnose_cycle` when it closes a failed cycle. It gathers this node's
evidence (:mod:`~resiliency.launcher._failure_evidence`), classifies it
(:mod:`~resiliency.launcher.failure_classes`), asks the stop rules
(:mod:`~resiliency.launcher.stop_rules`), logs one ``diagnosis`` line, records the ``diagnosis``
goodput event and carries out a stop or a restart without this node. A node diagnoses a cycle
when one of its ranks failed or a culprit of the (job-wide) hang verdict is one of its ranks: the
node that saw the failure decides, the others follow its shutdown as after a
``ShutdownWorkload``.

With several nodes the verdict is the job's (:mod:`._job_failure`): every node publishes its
evidence, node 0 classifies all of it, and the node the verdict names (the lowest culprit node
that took part, else node 0) records the event and decides. The paths that end a node outside a
failed cycle record their verdict here too: a worker's exit 78 (a configuration error: stop),
the scheduler's SIGTERM (a preemption), a failed node health check (the node leaves).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.ft import FaultToleranceConfig
from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher._config_error import CONFIG_ERROR_EXIT_CODE, stop_on_config_error
from resiliency.launcher._cycle import Cycle
from resiliency.launcher._failure_evidence import cycle_evidence, oom_kill_count
from resiliency.launcher._goodput_events import GoodputEvents
from resiliency.launcher._job_failure import JobFailureExchange, publish_preempted
from resiliency.launcher._job_progress import highest_step
from resiliency.launcher._node_handle import NodeHandle
from resiliency.launcher._workload_control import stop_the_job
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.failure_classes import (
    CycleEvidence,
    FailureClass,
    FailureVerdict,
    classify,
)
from resiliency.launcher.stop_rules import Action, StopDecision, StopRules

__all__ = [
    "CycleDiagnosis",
    "diagnose_cycle",
    "diagnose_node_end",
    "stop_rules_for",
]

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


#: How long node 0 waits for every node's failure evidence, beyond one monitoring interval:
#: a node hears of a failure elsewhere through the round's wake-up queue at once, and its own
#: hang exchange (when there was a hang) ended with node 0's.
_EVIDENCE_WAIT_S = 3.0


def _evidence(
    node: int,
    cycle: Cycle,
    attempt: int,
    failures: Mapping[int, ProcessFailure],
    *,
    health: tuple[str, ...] = (),
    preempted: str | None = None,
) -> CycleEvidence:
    start, now = cycle.oom_at_start, oom_kill_count()
    return cycle_evidence(
        node=node,
        attempt=attempt,
        failures=failures,
        hangs=cycle.diagnosis.hangs,
        verdict=cycle.hang_verdict,
        oom_kills=(now - start) if start is not None and now is not None else 0,
        health=health,
        preempted=preempted,
        signalled=cycle.signalled_ranks(),
        dead_monitors=cycle.dead_monitor_ranks(),
    )


def _verdict(node: NodeHandle, evidence: CycleEvidence) -> FailureVerdict | None:
    """The verdict this node records; None when another node records it (or nothing failed)."""
    shared = node.shared
    if shared is None or shared.world <= 1:
        verdict = classify(evidence)
        return None if verdict.cls is FailureClass.UNKNOWN else verdict
    wait_s = _EVIDENCE_WAIT_S + node.group.spec.monitor_interval
    job = JobFailureExchange(shared, wait_s).verdict(evidence)
    if job.verdict.cls is FailureClass.UNKNOWN:
        return None
    if job.recorder != evidence.node:
        logger.info("diagnosis (node %d decides): %s", job.recorder, job.verdict.summary())
        return None
    return job.verdict


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
    evidence = _evidence(group_rank, cycle, attempt, failures, health=health)
    verdict = _verdict(node, evidence)
    if verdict is None:
        return None
    exited_78 = sorted((r, f) for r, f in failures.items() if f.exitcode == CONFIG_ERROR_EXIT_CODE)
    if exited_78:
        # A worker's exit 78 is a configuration error a restart cannot fix, in any attempt.
        why = f"a worker exited {CONFIG_ERROR_EXIT_CODE} (EX_CONFIG): {verdict.summary()}"
        record = _record(verdict, StopDecision(Action.STOP, "config_exit_78", why), goodput)
        return CycleDiagnosis(record, stop_on_config_error(node, exited_78))
    rules.set_node(group_rank)
    decision = rules.decide(verdict, progress=highest_step(goodput.directory))
    if give_up and decision.action is Action.RESTART:
        decision = StopDecision(Action.STOP, "max_restarts", "no restarts left (--max-restarts)")
    record = _record(verdict, decision, goodput)
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


def _record(
    verdict: FailureVerdict, decision: StopDecision, goodput: GoodputEvents
) -> dict[str, Any]:
    """Log the verdict and its decision, write the ``diagnosis`` event; return the record."""
    logger.error(
        "diagnosis: %s; decision: %s (%s)",
        *(verdict.summary(), decision.action.value, decision.reason),
    )
    goodput.diagnosis(
        cls=verdict.cls.value,
        culprit_ranks=list(verdict.culprit_ranks),
        culprit_nodes=[str(n) for n in verdict.culprit_nodes],
        decision=decision.action.value,
        evidence={**verdict.evidence, "cause": verdict.cause, "rule": verdict.rule},
        rule=decision.rule,
    )
    return {
        "cls": verdict.cls.value,
        "culprit_ranks": list(verdict.culprit_ranks),
        "culprit_nodes": list(verdict.culprit_nodes),
        "cause": verdict.cause,
        "decision": decision.action.value,
        "rule": decision.rule,
    }


def _preempted(
    node: NodeHandle, cycle: Cycle, *, attempt: int, goodput: GoodputEvents, signal_name: str
) -> dict[str, Any]:
    """This node's launcher got the scheduler's stop signal: record a preemption of this node
    and tell the other nodes (their ranks may fail on losing this node's) before it stops.

    Returns:
        The record for ``--exit-status-file``'s ``diagnoses``.
    """
    group_rank = node.group.group_rank or 0
    why = f"the launcher of node {group_rank} got {signal_name} (the scheduler's stop)"
    evidence = _evidence(group_rank, cycle, attempt, {}, preempted=why)
    if node.shared is not None and node.shared.world > 1:
        publish_preempted(node.shared, evidence)
    decision = StopDecision(Action.STOP, "preempted", f"{why}: requeue the job")
    return _record(classify(evidence), decision, goodput)


def _leaving(
    node: NodeHandle, cycle: Cycle, *, attempt: int, goodput: GoodputEvents, health: tuple[str, ...]
) -> dict[str, Any]:
    """This node failed a health check and leaves the job: record why.

    Returns:
        The record for ``--exit-status-file``'s ``diagnoses``.
    """
    evidence = _evidence(node.group.group_rank or 0, cycle, attempt, {}, health=health)
    verdict = classify(evidence)
    decision = StopDecision(
        Action.RESTART_WITHOUT_NODE, "node_health", f"{verdict.cause}: this node leaves the job"
    )
    return _record(verdict, decision, goodput)


def _store_host_gone(
    node: NodeHandle, cycle: Cycle, *, attempt: int, goodput: GoodputEvents, lost: tuple[int, ...]
) -> dict[str, Any]:
    """The rendezvous store's host is gone: close the cycle as ``node_lost`` and stop.

    Returns:
        The record for ``--exit-status-file``'s ``diagnoses``.
    """
    goodput.cycle_ended()
    evidence = replace(_evidence(node.group.group_rank or 0, cycle, attempt, {}), lost_nodes=lost)
    why = "the rendezvous store's host is gone"
    verdict = classify(evidence)
    if verdict.cls is not FailureClass.NODE_LOST:  # no node to name: the rule needs one
        verdict = FailureVerdict(FailureClass.NODE_LOST, (), (), why, "store host gone", {})
    decision = StopDecision(
        Action.STOP, "store_host_lost", f"{why}: the job cannot go on under c10d rendezvous"
    )
    return _record(verdict, decision, goodput)


def diagnose_node_end(
    node: NodeHandle,
    cycle: Cycle,
    attempt: int,
    goodput: GoodputEvents,
    *,
    signal_name: str | None = None,
    health: tuple[str, ...] = (),
    lost: tuple[int, ...] | None = None,
) -> dict[str, Any] | None:
    """Diagnose how the job ends on this node outside a failed cycle.

    Args:
        node: this node.
        cycle: the current cycle.
        attempt: its restart count.
        goodput: where the ``diagnosis`` event goes.
        signal_name: the signal the launcher got, when one ends it: ``SIGTERM`` (the
            scheduler's stop) is a preemption of this node; SIGINT and the others are a user's
            stop, not a failure, and get no verdict.
        health: the failed health checks, when this node leaves for them.
        lost: when the rendezvous store's host is gone, the node(s) lost with it (empty when
            unknown): a ``node_lost`` verdict and a stop.

    Returns:
        The record for ``--exit-status-file``'s ``diagnoses``; None when there is no verdict.
    """
    if lost is not None:
        return _store_host_gone(node, cycle, attempt=attempt, goodput=goodput, lost=lost)
    if health:
        return _leaving(node, cycle, attempt=attempt, goodput=goodput, health=health)
    if signal_name == "SIGTERM":
        return _preempted(node, cycle, attempt=attempt, goodput=goodput, signal_name=signal_name)
    return None
