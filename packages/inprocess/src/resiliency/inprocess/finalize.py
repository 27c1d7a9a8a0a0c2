"""Finalize callbacks: rank-local clean-up after an abort, before the restart barrier."""

from __future__ import annotations

import abc
import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from resiliency.inprocess.exception import TimeoutError
from resiliency.inprocess.state import FrozenState

log = logging.getLogger(__name__)


class Finalize(abc.ABC):
    """Base class of the ``finalize`` argument of ``Wrapper``; compose several with ``Compose``."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        """Clean up this rank after a fault.

        Args:
            state: read-only wrapper state.

        Returns:
            ``state``, unchanged.
        """


class ThreadedFinalize(Finalize):
    """Run ``fn(*args, **kwargs)`` in a thread, and fail if it takes longer than ``timeout``.

    Args:
        timeout: how long ``fn`` may run.
        fn: the clean-up function.
        args: its positional arguments.
        kwargs: its keyword arguments.

    Raises:
        TimeoutError: (when called) ``fn`` did not return within ``timeout``.
    """

    def __init__(
        self,
        timeout: datetime.timedelta,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.timeout = timeout
        self.fn = fn
        self.args = args
        self.kwargs = kwargs or {}

    def __call__(self, state: FrozenState) -> FrozenState:
        """Run the function in a daemon thread under the deadline."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self.fn(*self.args, **self.kwargs)
            except Exception as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, name="inprocess-finalize", daemon=True)
        thread.start()
        thread.join(self.timeout.total_seconds())
        if thread.is_alive():
            raise TimeoutError(
                f"rank {state.rank}: finalize {getattr(self.fn, '__name__', self.fn)!r} did not "
                f"return within {self.timeout.total_seconds():g} s (ThreadedFinalize timeout)"
            )
        if errors:
            raise errors[0]
        return state
