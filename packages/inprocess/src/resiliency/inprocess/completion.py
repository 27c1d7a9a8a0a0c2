"""Completion callbacks (NVRx 0.5): run on a rank once the wrapped function completed there."""

from __future__ import annotations

import abc

from resiliency.inprocess.state import FrozenState


class Completion(abc.ABC):
    """Base class of the ``completion`` argument of ``Wrapper``; compose several with
    ``Compose``.

    Called on every rank that was not terminated, once, after the completion barrier of the
    iteration in which the wrapped function returned on every active rank. A failing
    completion is logged; the wrapped call still returns its value.
    """

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        """Act on the job's completion.

        Args:
            state: read-only wrapper state.

        Returns:
            ``state``, unchanged.
        """
