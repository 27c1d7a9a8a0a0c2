"""The stop rule: a fault that repeats with no progress in between is not restarted forever.

A deterministic failure (a bad batch, a wrong shape, a config error met at the same step) fails
every attempt the same way. After the restart barrier of iteration ``n`` every rank reads the
same records from the store (the fault records of ``n`` and of the iterations before it, and
each iteration's progress counter), so every rank reaches the same decision: when the last
``limit`` failed iterations have the same cause on the same ranks and none after the first made
progress, the wrapper stops on every rank with ``RepeatedFaultError``.

Progress is what the training function reports: a ``CallWrapper.ping()`` or a completed
``CallWrapper.atomic()`` block (``Healer.updating`` is one) on any rank. A function that reports
neither is judged on its causes alone.
"""

from __future__ import annotations

from typing import Any

from resiliency.inprocess._restart_store import RestartStore
from resiliency.inprocess.exception import RepeatedFaultError

Signature = tuple[tuple[int | None, str], ...]


def cause_of(record: dict[str, Any]) -> str:
    """The comparable cause of one fault record (no times, no durations)."""
    kind = record.get("kind")
    if kind == "soft_timeout":
        return f"hang (main thread at {record.get('where', 'unknown')})"
    if kind == "heartbeat":
        return "stopped sending heartbeats"
    return str(record.get("reason"))


def signature(store: RestartStore, iteration: int, ranks: list[int]) -> Signature:
    """What failed ``iteration``: the raising ranks and their exceptions; else the hang; else
    the ranks that went silent or died.

    A peer's failed collective is an echo, not reported; a hang stalls every rank, so its
    signature names no rank (whose soft timeout fired first is a matter of timing).
    """
    faults = store.faults(iteration, ranks)
    raised = tuple(sorted((r, cause_of(f)) for r, f in faults.items() if f["kind"] == "exception"))
    if raised:
        return raised
    hung = sorted({cause_of(f) for f in faults.values() if f["kind"] == "soft_timeout"})
    if hung:
        return tuple((None, cause) for cause in hung)
    return tuple(sorted((r, cause_of(f)) for r, f in faults.items()))


def check(store: RestartStore, *, iteration: int, ranks: list[int], limit: int | None) -> None:
    """Stop if ``iteration``'s fault is the ``limit``-th in a row with no progress between.

    Args:
        store: the wrapper's store.
        iteration: the iteration that just failed (its restart barrier is passed).
        ranks: every initial rank of the job.
        limit: ``Wrapper(max_repeated_faults=...)``; None or 0 disables the rule.

    Raises:
        RepeatedFaultError: on every rank alike, naming the cause, the ranks and the count.
    """
    if not limit:
        return
    last = signature(store, iteration, ranks)
    if not last:
        return
    first = iteration
    while (
        iteration - first + 1 < limit
        and first > 0
        and store.progress(first) == 0
        and signature(store, first - 1, ranks) == last
    ):
        first -= 1
    count = iteration - first + 1
    if count < limit:
        return
    culprits = sorted({r for r, _ in last if r is not None})
    causes = "; ".join(sorted({cause for _, cause in last}))
    where = f"on initial rank(s) {culprits}" if culprits else "on every rank (a hang)"
    raise RepeatedFaultError(
        f"the same fault ended {count} attempts in a row {where} with no progress in between "
        f"(iterations {first}-{iteration}): {causes}; not restarting it again "
        f"(Wrapper(max_repeated_faults={limit}); fix the cause, or pass "
        "max_repeated_faults=None to restart without this limit)"
    )
