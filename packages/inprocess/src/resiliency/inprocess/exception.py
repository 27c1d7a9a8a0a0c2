"""The errors of resiliency.inprocess, under NVRx's names.

``RestartError`` is the package's one base error. ``RestartAbort`` and ``RankShouldRestart``
derive from ``BaseException`` on purpose, as in NVRx: a training loop's ``except Exception``
must not swallow them.
"""

from __future__ import annotations


class RestartError(Exception):
    """Base error of resiliency.inprocess."""


class ConfigError(RestartError, ValueError):
    """A bad argument to ``Wrapper`` or a helper: wrong type, order of timeouts, unknown name."""


class TopologyError(ConfigError, RuntimeError):
    """The ranks' keys do not form one topology tree (``rank_assignment.Tree``): several root
    keys, or a ``world_size_filter`` that grew the world. A ``RuntimeError`` too, as NVRx
    raises."""


class HealthCheckError(RestartError):
    """A health check failed on this rank: it leaves the job instead of restarting."""


class InternalError(RestartError):
    """The restart machinery itself failed (a store that went away, a broken callback)."""


class UnassignedRankError(InternalError):
    """A rank assignment left this rank ``INITIALIZED`` (neither active, a spare nor
    terminated). Raised in the iteration and restarted like a fault of the function, as NVRx's
    ``InternalError`` there is.

    Args:
        rank: the rank left unassigned, named in the message.
    """

    def __init__(self, rank: int) -> None:
        super().__init__(
            # No iteration in it: the stop rule compares the messages of successive faults.
            f"rank {rank}: the rank assignment left it in mode INITIALIZED; a rank_assignment "
            "must set ACTIVE, INACTIVE or TERMINATED (end a custom chain with ActivateAllRanks() "
            "or ShiftRanks())"
        )


class TimeoutError(RestartError):  # NVRx's name, kept for drop-in imports
    """A wait of the restart machinery passed its deadline (barrier, completion, finalize)."""


class RepeatedFaultError(RestartError):
    """The same fault, on the same ranks, ended ``max_repeated_faults`` attempts in a row with no
    progress in between: restarting again would meet it again. Raised on every rank."""


class RestartAbort(BaseException):
    """Raised by user code or a callback: stop restarting, on this rank, at once."""


class RankShouldRestart(BaseException):
    """Raised in the main thread when a fault elsewhere asks this rank to restart."""


class HealError(RestartError):
    """A rank's state could not be healed from its peers: no consistent source, every copy
    failed verification, or the state cannot be sent. Like every ``RestartError`` raised in the
    wrapped function it stops the job (restarting would meet the same state again)."""


class RollbackError(RestartError):
    """The ranks reported different steps to ``Rollback.resumed``: resuming would mix steps.
    Like every ``RestartError`` raised in the wrapped function it stops the job."""
