"""One diagnosis per failed cycle: evidence, class, decision, the ledger's ``diagnosis`` event.

The agent calls :func:`diagnose_cycle` when it closes a failed cycle. It gathers this node's
evidence (:mod:`~resiliency.launcher.failure_evidence`), classifies it
(:mod:`~resiliency.launcher.failure_classes`), asks the stop rules
(:mod:`~resiliency.launcher.stop_rules`), logs one ``diagnosis`` line, records the ``diagnosis``
goodput event and carries out a stop or a restart without this node. A node diagnoses a cycle
when one of its ranks failed or a culprit of the (job-wide) hang verdict is one of its ranks: the
node that saw the failure decides, the others follow its shutdown as after a
``ShutdownWorkload``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torch.distributed.elastic.agent.server.api import RunResult

from resiliency.launcher.agent_settings import Outcome
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.failure_classes import FailureClass, FailureVerdict, classify
from resiliency.launcher.failure_evidence import cycle_evidence, oom_kill_count
from resiliency.launcher.job_progress import highest_step
from resiliency.launcher.stop_rules import Action, StopDecision, StopRules
from resiliency.launcher.workload_control import stop_the_job, stopped_result

if TYPE_CHECKING:
    from resiliency.launcher.agent import FtElasticAgent

__all__ = ["diagnose_cycle", "stop_rules_for"]

logger = logging.getLogger(__name__)


def stop_rules_for(agent: FtElasticAgent) -> StopRules:
    """The stop rules with the agent's configuration."""
    cfg = agent._settings.ft_cfg
    return StopRules(
        0, cfg.max_no_progress_cycles, cfg.restart_storm_restarts, cfg.restart_storm_window
    )


def _verdict(agent: FtElasticAgent, result: RunResult) -> FailureVerdict | None:
    cycle = agent._cycle
    group = agent.worker_group
    node = group.group_rank or 0
    start, now = cycle.oom_at_start, oom_kill_count()
    health = agent._health.failures() if agent._health is not None else []
    evidence = cycle_evidence(
        node=node,
        attempt=group.spec.max_restarts - agent.remaining_restarts,
        failures=result.failures,
        hangs=cycle.diagnosis.hangs,
        verdict=cycle.hang_verdict,
        oom_kills=(now - start) if start is not None and now is not None else 0,
        health=tuple(f"{h.name}: {h.detail}" for h in health),
    )
    verdict = classify(evidence)
    if verdict.cls is FailureClass.UNKNOWN:
        return None  # nothing failed here: the node that saw the failure diagnoses it
    if verdict.culprit_nodes and node not in verdict.culprit_nodes:
        return None  # a hang whose culprit is on another node: that node decides
    return verdict


def diagnose_cycle(agent: FtElasticAgent, result: RunResult, give_up: bool) -> RunResult | None:
    """Diagnose the failed cycle that just ended on this node, record it and act on it.

    Args:
        agent: this node's agent.
        result: torch's result of the cycle (its failures).
        give_up: the restart policy already gave up (no restarts left): a restart is recorded
            as ``stop``, and the caller ends the job as before.

    Returns:
        The result to return from the supervision loop when the diagnosis ended the job on
        this node (stop, or restart without this node); None to go on as the policy decided.
    """
    verdict = _verdict(agent, result)
    if verdict is None:
        return None
    rules: StopRules = agent.stop_rules
    rules.set_node(agent.worker_group.group_rank or 0)
    decision = rules.decide(verdict, progress=highest_step(agent.goodput.directory))
    if give_up and decision.action is Action.RESTART:
        decision = StopDecision(Action.STOP, "max_restarts", "no restarts left (--max-restarts)")
    logger.error(
        "diagnosis: %s; decision: %s (%s)",
        *(verdict.summary(), decision.action.value, decision.reason),
    )
    agent.diagnoses.append(
        {
            "cls": verdict.cls.value,
            "culprit_ranks": list(verdict.culprit_ranks),
            "culprit_nodes": list(verdict.culprit_nodes),
            "cause": verdict.cause,
            "decision": decision.action.value,
            "rule": decision.rule,
        }
    )
    agent.goodput.diagnosis(
        cls=verdict.cls.value,
        culprit_ranks=list(verdict.culprit_ranks),
        culprit_nodes=[str(n) for n in verdict.culprit_nodes],
        decision=decision.action.value,
        evidence={**verdict.evidence, "cause": verdict.cause, "rule": verdict.rule},
        rule=decision.rule,
    )
    if decision.rule == "max_restarts" or decision.action is Action.RESTART:
        return None
    if decision.action is Action.RESTART_WITHOUT_NODE:
        logger.error("%s; this node leaves the job, the others go on without it", decision.reason)
        if agent._shared is not None:
            agent._shared.publish_left()
        agent._stop_workers(agent.worker_group)
        agent.outcome = Outcome(ExitCode.NODE_EXCLUDED, "node_unhealthy", decision.reason)
        return stopped_result(agent.worker_group)
    rank = verdict.culprit_ranks[0] if verdict.culprit_ranks else None
    logger.error("stopping the job on every node, no more restarts: %s", decision.reason)
    stop_the_job(agent, rank, f"diagnosis: {decision.reason}")
    if decision.rule == "config_first_attempt":
        agent.outcome = Outcome(ExitCode.USAGE, "config_error", decision.reason)
    else:
        reason = f"stopped_{decision.rule}"
        agent.outcome = Outcome(ExitCode.DIAGNOSED_STOP, reason, decision.reason)
    return stopped_result(agent.worker_group)
