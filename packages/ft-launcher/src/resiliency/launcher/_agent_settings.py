"""What the agent is configured with, and how the job ended on a node."""

from __future__ import annotations

from dataclasses import dataclass

from resiliency.ft import FaultToleranceConfig
from resiliency.launcher._preemption import Preemption
from resiliency.launcher.fork_server import ForkServer
from resiliency.launcher.health import HealthCheck
from resiliency.launcher.policy import RestartPolicy

__all__ = ["AgentSettings", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """How the job ended on this node.

    Attributes:
        exit_code: the launcher's exit code (see :mod:`resiliency.launcher.exit_codes`).
        reason: a short machine-friendly reason (``succeeded``, ``restarts_exhausted``, ...).
        detail: one human-readable line (the root cause when it failed).
    """

    exit_code: int
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class AgentSettings:
    """The agent's fault-tolerance settings.

    Attributes:
        ft_cfg: the monitors' configuration.
        policy: the restart policy.
        min_nodes: MIN of ``--nnodes MIN:MAX``.
        workers_stop_timeout: SIGTERM -> SIGKILL delay when stopping workers for a restart.
        health_checks: run before every (re)join of the rendezvous.
        finished_flag_file: passed to the workers as FAULT_TOL_FINISHED_FLAG_FILE.
        preemption: graceful preemption (workers that saved exit 75: no restart, exit 5).
        fork_server: workers are forked from it (``--ft-preimport``), else started anew.
        inprocess_respawn: a worker killed by a signal is respawned alone, and its
            ``resiliency.inprocess.Wrapper`` rejoins the others (``--ft-inprocess-respawn``).
        respawn_timeout: seconds a respawned worker has to join before the group is restarted.
    """

    ft_cfg: FaultToleranceConfig
    policy: RestartPolicy
    min_nodes: int
    workers_stop_timeout: float
    health_checks: tuple[HealthCheck, ...] = ()
    finished_flag_file: str | None = None
    preemption: Preemption | None = None
    fork_server: ForkServer | None = None
    inprocess_respawn: bool = False
    respawn_timeout: float = 60.0
