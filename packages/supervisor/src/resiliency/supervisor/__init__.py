"""resiliency.supervisor: job-wide supervision for ft-launcher jobs.

Node sensors publish one document per interval into the job's engine (its c10d ``TCPStore``, or
etcd v3); a controller turns them into decisions through policies with hysteresis; decisions are
intents the nodes' launchers act on; each launcher serves a Prometheus status endpoint.
See ``docs/supervisor.md``.
"""

from resiliency.supervisor.backend import (
    ETCD_URL_OPTIONS,
    Backend,
    BackendURL,
    parse_backend_url,
)
from resiliency.supervisor.connect import backend_from_url
from resiliency.supervisor.controller import Controller, CycleStats
from resiliency.supervisor.document import (
    DOC_VERSION,
    NODE_STATES,
    GpuDevice,
    NodeStatus,
    RankStatus,
    keys_for,
)
from resiliency.supervisor.errors import (
    BackendAuthError,
    BackendError,
    BackendTLSError,
    BackendUnavailableError,
    PolicyError,
    StaleGenerationError,
    SupervisorError,
)
from resiliency.supervisor.generation import (
    Generation,
    claim_generation,
    default_issuer,
    read_generation,
)
from resiliency.supervisor.gpu import CRITICAL_XIDS, GpuWatch
from resiliency.supervisor.intents import ACTIONS, Intent, read_intent, refusal, write_intent
from resiliency.supervisor.metrics import StatusServer, start_status_server
from resiliency.supervisor.policies import (
    Decision,
    DiagnosisPolicy,
    GpuHealthPolicy,
    NodeLostPolicy,
    NodeView,
    Observation,
    Policy,
    StragglerPolicy,
    load_policies,
)
from resiliency.supervisor.sensor import DEFAULT_INTERVAL_S, NODE_ID_ENV, NodeSensor, Probe
from resiliency.supervisor.status_table import job_rows, render_table

__all__ = [
    "ACTIONS",
    "CRITICAL_XIDS",
    "DEFAULT_INTERVAL_S",
    "DOC_VERSION",
    "ETCD_URL_OPTIONS",
    "NODE_ID_ENV",
    "NODE_STATES",
    "Backend",
    "BackendAuthError",
    "BackendError",
    "BackendTLSError",
    "BackendURL",
    "BackendUnavailableError",
    "Controller",
    "CycleStats",
    "Decision",
    "DiagnosisPolicy",
    "Generation",
    "GpuDevice",
    "GpuHealthPolicy",
    "GpuWatch",
    "Intent",
    "NodeLostPolicy",
    "NodeSensor",
    "NodeStatus",
    "NodeView",
    "Observation",
    "Policy",
    "PolicyError",
    "Probe",
    "RankStatus",
    "StaleGenerationError",
    "StatusServer",
    "StragglerPolicy",
    "SupervisorError",
    "backend_from_url",
    "claim_generation",
    "default_issuer",
    "job_rows",
    "keys_for",
    "load_policies",
    "parse_backend_url",
    "read_generation",
    "read_intent",
    "refusal",
    "render_table",
    "start_status_server",
    "write_intent",
]
