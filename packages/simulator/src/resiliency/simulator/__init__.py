"""resiliency.simulator: seeded failure injection into real jobs, from outside the training script.

See docs/simulator.md.
"""

from resiliency.simulator.errors import InjectionError, PlanError, SimulatorError
from resiliency.simulator.injectors import HOOK_ENV, HOOK_SIGNALS
from resiliency.simulator.outcome import FaultOutcome, format_table, outcomes, timeline_of
from resiliency.simulator.plan import FAULT_KINDS, NODE_FAULTS, Fault, FaultPlan
from resiliency.simulator.runner import Injection, JobRunner, RunnerOptions

__all__ = [
    "FAULT_KINDS",
    "HOOK_ENV",
    "HOOK_SIGNALS",
    "NODE_FAULTS",
    "Fault",
    "FaultOutcome",
    "FaultPlan",
    "Injection",
    "InjectionError",
    "JobRunner",
    "PlanError",
    "RunnerOptions",
    "SimulatorError",
    "format_table",
    "outcomes",
    "timeline_of",
]
