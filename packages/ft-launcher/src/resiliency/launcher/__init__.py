"""resiliency.launcher: ``ft-launcher``, a torchrun drop-in that restarts hung and failed workers.

The console scripts ``ft-launcher`` and ``ft_launcher`` run :func:`main`. The pieces are public
for tests and for users who build their own launcher on torch's elastic agent.
"""

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
from resiliency.launcher.verdict import HangVerdict, analyze_hang, parse_stack_dump

__all__ = [
    "AgentSettings",
    "AnyFailedPolicy",
    "CallableHealthCheck",
    "CommandHealthCheck",
    "Decision",
    "ExitCode",
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
    "RestartPolicy",
    "TorchVersionError",
    "analyze_hang",
    "build_parser",
    "main",
    "parse_stack_dump",
]
