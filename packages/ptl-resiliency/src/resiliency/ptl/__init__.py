"""resiliency.ptl: Lightning callbacks for hang detection, auto-resume, straggler detection and
checkpoints (asynchronous on every rank, and an agreed emergency save on preemption).

The callbacks are thin adapters: hang detection lives in ``resiliency.ft`` (the rank monitor that
``ft-launcher`` starts), straggler scoring in ``resiliency.straggler``, checkpoints in
``resiliency.checkpoint``. Works with ``lightning`` and, where installed, ``pytorch_lightning``.
"""

from resiliency.ptl.autoresume import FINISHED_FLAG_ENV
from resiliency.ptl.checkpointing import (
    CheckpointCallbackConfigError,
    DistributedCheckpointCallback,
)
from resiliency.ptl.emergency import EmergencyCheckpointCallback
from resiliency.ptl.errors import AutoResumeConfigError, LauncherRequiredError, PtlResiliencyError
from resiliency.ptl.fault_tolerance import FaultToleranceCallback
from resiliency.ptl.fault_tolerance_sections import (
    SECTION_CHECKPOINTING,
    SECTION_SETUP,
    SECTION_STEP,
    ExceptionHandlingPolicy,
    FaultToleranceSectionsCallback,
    shutdown_on,
)
from resiliency.ptl.ft_state import FT_STATE_FILE_NAME
from resiliency.ptl.local_checkpoint import LocalCheckpointCallback
from resiliency.ptl.simulated_fault import SimulatedFaultParams
from resiliency.ptl.straggler_detection import StragglerDetectionCallback

__all__ = [
    "FINISHED_FLAG_ENV",
    "FT_STATE_FILE_NAME",
    "SECTION_CHECKPOINTING",
    "SECTION_SETUP",
    "SECTION_STEP",
    "AutoResumeConfigError",
    "CheckpointCallbackConfigError",
    "DistributedCheckpointCallback",
    "EmergencyCheckpointCallback",
    "ExceptionHandlingPolicy",
    "FaultToleranceCallback",
    "FaultToleranceSectionsCallback",
    "LauncherRequiredError",
    "LocalCheckpointCallback",
    "PtlResiliencyError",
    "SimulatedFaultParams",
    "StragglerDetectionCallback",
    "shutdown_on",
]
