"""Workload-control requests: a rank asks the launcher to stop the job or to drop its node."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from resiliency.ft.errors import ProtocolError

__all__ = ["WorkloadAction", "WorkloadControlRequest"]

_MAX_DESCRIPTION_CHARS = 4096


class WorkloadAction(str, enum.Enum):
    """What a rank asks the launcher to do.

    NVIDIA's resiliency extension numbers the actions (``Continue = 0``, ``ExcludeThisNode = 1``,
    ``ShutdownWorkload = 2``); those numbers are accepted too: ``WorkloadAction(2)`` is
    ``WorkloadAction.ShutdownWorkload``. Here the values are the names.

    Attributes:
        Continue: Nothing to do: the launcher goes on as usual (logged).
        ShutdownWorkload: Stop every worker of the job and do not restart them.
        ExcludeThisNode: Take this node out of the job (e.g. a failing GPU) and restart elsewhere.
    """

    Continue = "Continue"
    ExcludeThisNode = "ExcludeThisNode"
    ShutdownWorkload = "ShutdownWorkload"

    @classmethod
    def _missing_(cls, value: object) -> WorkloadAction | None:
        if isinstance(value, int) and not isinstance(value, bool):
            return _NVRX_NUMBERS.get(value)
        if isinstance(value, enum.Enum):  # another tool's WorkloadAction member
            return cls.__members__.get(value.name)
        return None

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


_NVRX_NUMBERS = {
    0: WorkloadAction.Continue,
    1: WorkloadAction.ExcludeThisNode,
    2: WorkloadAction.ShutdownWorkload,
}


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
