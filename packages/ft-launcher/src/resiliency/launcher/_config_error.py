"""A worker that ended on a configuration error exits 78: the launcher stops the job, exits 2.

A configuration error (a checkpoint directory the job cannot write, an auto-resume flag file
nobody named) fails every restart the same way. The contract with the ranks (the other side is
``resiliency.checkpoint.config_error_exit``; neither imports the other): a rank whose
configuration error goes uncaught exits ``CONFIG_ERROR_EXIT_CODE`` (78, ``EX_CONFIG`` in
``sysexits.h``). On seeing it the launcher restarts nothing: it stops the job on every node (the
other nodes follow as after a ``ShutdownWorkload``) and exits 2 (``USAGE``, "fix the
configuration"), with the ranks in ``--exit-status-file``; the rank's own log says what to fix.
"""

from __future__ import annotations

import logging

from torch.distributed.elastic.agent.server.api import RunResult
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher._node_handle import NodeHandle
from resiliency.launcher._workload_control import stop_the_job
from resiliency.launcher.exit_codes import ExitCode

__all__ = ["CONFIG_ERROR_EXIT_CODE", "config_error_failures", "stop_on_config_error"]

logger = logging.getLogger(__name__)

#: The exit code of a rank that ended on a configuration error (``EX_CONFIG``).
CONFIG_ERROR_EXIT_CODE = 78


def config_error_failures(result: RunResult) -> list[tuple[int, ProcessFailure]]:
    """The workers of ``result`` that exited 78, by global rank (empty when none did)."""
    return sorted(
        (rank, failure)
        for rank, failure in result.failures.items()
        if failure.exitcode == CONFIG_ERROR_EXIT_CODE
    )


def stop_on_config_error(node: NodeHandle, failures: list[tuple[int, ProcessFailure]]) -> Outcome:
    """Stop the job on every node without a restart; the launcher exits 2 (``USAGE``).

    Args:
        node: this node.
        failures: the workers that exited 78 (:func:`config_error_failures`), not empty.

    Returns:
        The outcome to record (the workers are stopped).
    """
    ranks = ", ".join(f"rank {r} (local rank {f.local_rank}, pid {f.pid})" for r, f in failures)
    detail = (
        f"{ranks} exited {CONFIG_ERROR_EXIT_CODE}: a configuration error (the rank's log says "
        "what to fix); a restart would fail the same way, so none is made"
    )
    logger.error("%s; stopping the job on every node", detail)
    stop_the_job(node, failures[0][0], f"configuration error: {detail}")
    return Outcome(ExitCode.USAGE, "worker_config_error", detail)
