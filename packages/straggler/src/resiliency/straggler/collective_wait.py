"""Sections timed net of the wait inside DDP's gradient all-reduce: the slow rank under DDP.

Under DDP every rank's step takes as long as the slowest rank's, because the gradient all-reduce
waits for it: wall-time section scores see no straggler. What differs is where the time goes. A
rank that computes slowly reaches the all-reduce last and hardly waits; the others wait for it.
:class:`CollectiveWait` is a DDP communication hook (the default all-reduce, timed) that measures
how long this rank was blocked in the last bucket's all-reduce of each backward pass: from the
moment the last gradients were ready to the moment their all-reduce completed, which is when
``backward()`` returns. :meth:`CollectiveWait.section` times a section minus that wait, so the
ordinary relative scores of the report name the rank that is slow in its own computation.

Opt-in: one timed callback per bucket and two clock readings per section entry (see
``benchmarks/bench_straggler.py``). torch is needed, as for DDP itself.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from time import perf_counter_ns
from types import TracebackType
from typing import Any

from resiliency.straggler.detector import Detector
from resiliency.straggler.errors import StragglerConfigError
from resiliency.straggler.sections import SectionTimings

__all__ = ["CollectiveWait"]

_SKIPPED = -1


class CollectiveWait:
    """Time this rank's wait inside DDP's gradient all-reduce.

    Args:
        ddp: the ``DistributedDataParallel`` module; its communication hook is replaced by the
            default all-reduce (sum, then divided by the group size, as DDP does), timed. A
            module that already has a hook is refused: this one would replace it.
        clock: monotonic clock in integer nanoseconds.

    Raises:
        StragglerConfigError: ``ddp`` is not a DDP module or already has a communication hook.
    """

    def __init__(self, ddp: Any, clock: Callable[[], int] = perf_counter_ns) -> None:
        if not hasattr(ddp, "register_comm_hook"):
            raise StragglerConfigError(
                f"CollectiveWait needs a torch DistributedDataParallel module, got {type(ddp)}"
            )
        self._dist = importlib.import_module("torch.distributed")  # torch comes with DDP
        self._clock = clock
        self._lock = threading.Lock()
        self._blocked_ns = 0
        self._group = ddp.process_group
        try:
            # A lambda: torch checks a hook's annotations against its own classes, and this
            # module's are strings (postponed evaluation).
            ddp.register_comm_hook(None, lambda state, bucket: self._hook(state, bucket))  # noqa: PLW0108
        except RuntimeError as exc:  # torch allows one communication hook per module
            raise StragglerConfigError(
                f"cannot time the DDP all-reduce: {exc}; CollectiveWait installs the default "
                "all-reduce as the module's communication hook, so give it a module without one"
            ) from exc

    @property
    def blocked_ns(self) -> int:
        """Total nanoseconds this rank was blocked in the last bucket's all-reduce so far."""
        return self._blocked_ns

    def _hook(self, state: object, bucket: Any) -> Any:
        dist = self._dist
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size(self._group))
        called = self._clock()
        future = dist.all_reduce(buffer, group=self._group, async_op=True).get_future()
        if not bucket.is_last():
            return future.then(lambda f: f.value()[0])

        def done(f: Any) -> Any:
            blocked = self._clock() - called
            with self._lock:
                self._blocked_ns += blocked
            return f.value()[0]

        return future.then(done)

    def section(self, name: str) -> _NetSection:
        """A context manager timing section ``name`` net of the collective wait inside it.

        The section's durations go to the Detector like any other section's, so its relative
        scores name the rank that computes slowly. Wrap the whole step (or at least the
        backward pass): the wait ends when ``backward()`` returns.

        Args:
            name: the section name in reports (for example ``"step (net of all-reduce wait)"``).

        Raises:
            DetectorStateError: the Detector is not initialized.
        """
        cpu = Detector.detection_section(name, profile_cuda=False)
        return _NetSection(cpu.timings, self, self._clock)


class _NetSection:
    """Times one entry minus the collective wait that happened during it."""

    __slots__ = ("_clock", "_starts", "_timings", "_wait")

    def __init__(
        self, timings: SectionTimings, wait: CollectiveWait, clock: Callable[[], int]
    ) -> None:
        self._timings = timings
        self._wait = wait
        self._clock = clock
        self._starts: list[tuple[int, int]] = []

    def __enter__(self) -> None:
        if self._timings.take_sample():
            self._starts.append((self._clock(), self._wait.blocked_ns))
        else:
            self._starts.append((_SKIPPED, 0))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = self._clock()
        start, blocked = self._starts.pop()
        if start != _SKIPPED:
            waited = self._wait.blocked_ns - blocked
            self._timings.record(max(end - start - waited, 0))
