"""resiliency.launcher: ``ft-launcher``, a torchrun drop-in that restarts hung and failed workers.

The console scripts ``ft-launcher`` and ``ft_launcher`` run :func:`main`. The pieces are public
for tests and for users who build their own launcher on torch's elastic agent.

They are imported on first use (PEP 562): the console script starts its fork server before
anything here imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resiliency.launcher.agent import AgentSettings, FtElasticAgent, Outcome
    from resiliency.launcher.cli import main
    from resiliency.launcher.errors import (
        ForkServerError,
        HealthCheckError,
        LauncherConfigError,
        LauncherError,
        TorchVersionError,
    )
    from resiliency.launcher.exit_codes import ExitCode
    from resiliency.launcher.failure_classes import (
        CycleEvidence,
        FailureClass,
        FailureVerdict,
        RankEvidence,
        classify,
    )
    from resiliency.launcher.fork_server import ForkServer
    from resiliency.launcher.health import (
        CallableHealthCheck,
        CommandHealthCheck,
        HealthCheck,
        HealthResult,
        NvmlGpuHealthCheck,
    )
    from resiliency.launcher.options import build_parser
    from resiliency.launcher.policy import (
        AnyFailedPolicy,
        Decision,
        GroupObservation,
        LocalState,
        MinHealthyPolicy,
        RestartPolicy,
    )
    from resiliency.launcher.rendezvous import FreshStoreRendezvousHandler
    from resiliency.launcher.stop_rules import StopDecision, StopRules
    from resiliency.launcher.verdict import HangVerdict, analyze_hang, parse_stack_dump

_SOURCES = {
    "AgentSettings": "resiliency.launcher.agent",
    "AnyFailedPolicy": "resiliency.launcher.policy",
    "CallableHealthCheck": "resiliency.launcher.health",
    "CommandHealthCheck": "resiliency.launcher.health",
    "CycleEvidence": "resiliency.launcher.failure_classes",
    "Decision": "resiliency.launcher.policy",
    "ExitCode": "resiliency.launcher.exit_codes",
    "FailureClass": "resiliency.launcher.failure_classes",
    "FailureVerdict": "resiliency.launcher.failure_classes",
    "ForkServer": "resiliency.launcher.fork_server",
    "ForkServerError": "resiliency.launcher.errors",
    "FreshStoreRendezvousHandler": "resiliency.launcher.rendezvous",
    "FtElasticAgent": "resiliency.launcher.agent",
    "GroupObservation": "resiliency.launcher.policy",
    "HangVerdict": "resiliency.launcher.verdict",
    "HealthCheck": "resiliency.launcher.health",
    "HealthCheckError": "resiliency.launcher.errors",
    "HealthResult": "resiliency.launcher.health",
    "LauncherConfigError": "resiliency.launcher.errors",
    "LauncherError": "resiliency.launcher.errors",
    "LocalState": "resiliency.launcher.policy",
    "MinHealthyPolicy": "resiliency.launcher.policy",
    "NvmlGpuHealthCheck": "resiliency.launcher.health",
    "Outcome": "resiliency.launcher.agent",
    "RankEvidence": "resiliency.launcher.failure_classes",
    "RestartPolicy": "resiliency.launcher.policy",
    "StopDecision": "resiliency.launcher.stop_rules",
    "StopRules": "resiliency.launcher.stop_rules",
    "TorchVersionError": "resiliency.launcher.errors",
    "analyze_hang": "resiliency.launcher.verdict",
    "build_parser": "resiliency.launcher.options",
    "classify": "resiliency.launcher.failure_classes",
    "main": "resiliency.launcher.cli",
    "parse_stack_dump": "resiliency.launcher.verdict",
}

__all__ = [
    "AgentSettings",
    "AnyFailedPolicy",
    "CallableHealthCheck",
    "CommandHealthCheck",
    "CycleEvidence",
    "Decision",
    "ExitCode",
    "FailureClass",
    "FailureVerdict",
    "ForkServer",
    "ForkServerError",
    "FreshStoreRendezvousHandler",
    "FtElasticAgent",
    "GroupObservation",
    "HangVerdict",
    "HealthCheck",
    "HealthCheckError",
    "HealthResult",
    "LauncherConfigError",
    "LauncherError",
    "LocalState",
    "MinHealthyPolicy",
    "NvmlGpuHealthCheck",
    "Outcome",
    "RankEvidence",
    "RestartPolicy",
    "StopDecision",
    "StopRules",
    "TorchVersionError",
    "analyze_hang",
    "build_parser",
    "classify",
    "main",
    "parse_stack_dump",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
