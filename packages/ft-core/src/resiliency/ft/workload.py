"""Workload-control requests: a rank asks the launcher to stop the job or to drop its node."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from resiliency.ft.errors import ProtocolError

__all__ = ["WorkloadAction", "WorkloadControlRequest"]

_MAX_DESCRIPTION_CHARS = 4096


class WorkloadAction(str, enum.Enum):
    """What a rank asks the launcher to do.

    Attributes:
        ShutdownWorkload: Stop every worker of the job and do not restart them.
        ExcludeThisNode: Take this node out of the job (e.g. a failing GPU) and restart elsewhere.
    """

    ShutdownWorkload = "ShutdownWorkload"
    ExcludeThisNode = "ExcludeThisNode"

    @classmethod
    def parse(cls, value: str | WorkloadAction) -> WorkloadAction:
        """Return the action named ``value``.

        Args:
            value: An action or its name.

        Returns:
            The action.

        Raises:
            ProtocolError: The name is not an action.
        """
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(a.value for a in cls)
            raise ProtocolError(
                f"unknown workload action {value!r:.60}; valid actions: {valid}"
            ) from None


@dataclass(frozen=True)
class WorkloadControlRequest:
    """A request from a rank to whoever runs the job (the launcher), delivered via the monitor.

    Attributes:
        action: What to do.
        description: Why, for the launcher's log.
    """

    action: WorkloadAction
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", WorkloadAction.parse(self.action))
        if not isinstance(self.description, str):
            raise ProtocolError(
                f"a workload control description must be a string, got "
                f"{type(self.description).__name__}"
            )
        if len(self.description) > _MAX_DESCRIPTION_CHARS:
            object.__setattr__(
                self, "description", self.description[:_MAX_DESCRIPTION_CHARS] + " [truncated]"
            )
