"""Terminate callbacks (NVRx 0.5): run on a rank whose wrapped call ends with an exception."""

from __future__ import annotations

import abc

from resiliency.inprocess.state import FrozenState


class Terminate(abc.ABC):
    """Base class of the ``terminate`` argument of ``Wrapper``; compose several with
    ``Compose``.

    Called once on a rank that leaves the job instead of restarting: the stop rule, a
    ``RestartAbort`` or another terminal exception, a failed health check, a rank the others
    discarded, Ctrl-C. It runs after the rank told the others it left, just before the
    exception propagates out of the wrapped call. If it raises, that exception propagates,
    chained to the one that ended the call.
    """

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        """Act on this rank's termination.

        Args:
            state: read-only wrapper state.

        Returns:
            ``state``, unchanged.
        """
