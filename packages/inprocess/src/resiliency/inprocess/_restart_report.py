"""A finished restart: its log line, and its ``inprocess_restart`` event in the goodput ledger.

The event is written once per restart, by the rank that is rank 0 after it, and only when the
launcher (or the user) set the ledger directory (`resiliency.goodput.DIR_ENV`). Recording never
stops a restart: a problem is logged and training goes on.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from resiliency.goodput import DIR_ENV, get_recorder
from resiliency.inprocess._restart_store import RestartStore
from resiliency.inprocess.state import State

log = logging.getLogger(__name__)

# The store's fault kinds, as the ledger's causes (a peer's heartbeat stopped, or its process
# died and was respawned: its fault, seen from outside; the soft timeout: a hang).
_CAUSES = {
    "exception": "exception",
    "soft_timeout": "hang",
    "heartbeat": "peer_fault",
    "respawn": "peer_fault",
}
# The root cause first: a dead rank's respawn (its peers' failed collectives only echo it), then
# a rank's own fault (an exception, its hang), then a silent peer.
_ORDER = {"respawn": 0, "heartbeat": 2}


@dataclass(frozen=True)
class RestartTimes:
    """Monotonic times at the end of each phase of one restart, on this rank."""

    started: float
    aborted: float
    checked: float
    met: float
    done: float

    def phases(self) -> dict[str, float]:
        """Seconds per phase."""
        return {
            "abort": round(self.aborted - self.started, 6),
            "health_check": round(self.checked - self.aborted, 6),
            "barrier": round(self.met - self.checked, 6),
            "release": round(self.done - self.met, 6),
        }


def report_restart(
    store: RestartStore,
    state: State,
    *,
    failed: int,
    members: list[int],
    survivors: list[int],
    times: RestartTimes,
) -> None:
    """Log the restart from iteration ``failed`` and, on the new rank 0, record it.

    Args:
        store: the wrapper's store.
        state: this rank's state after the restart.
        failed: the iteration that failed.
        members: the initial ranks of the failed iteration.
        survivors: the initial ranks that go on.
        times: this rank's phase times.
    """
    lost = [r for r in members if r not in survivors]
    phases = times.phases()
    log.warning(
        "rank %d (initial %d): restart %d -> %d in %.3f s (abort %.3f s, finalize and health "
        "check %.3f s, barrier %.3f s, freeing the failed call %.3f s); lost initial ranks %s; "
        "world size %d",
        state.rank,
        state.initial_rank,
        failed,
        state.iteration,
        times.done - times.started,
        phases["abort"],
        phases["health_check"],
        phases["barrier"],
        phases["release"],
        lost or "none",
        state.world_size,
    )
    if state.rank != 0 or not os.environ.get(DIR_ENV):
        return
    try:
        _record(store, state, failed=failed, members=members, lost=lost, times=times)
    except Exception as exc:  # the ledger is a record: never stop training for it
        log.warning(
            "rank %d: could not record restart %d -> %d in the goodput ledger (%s: %s); "
            "training goes on",
            state.rank,
            failed,
            state.iteration,
            type(exc).__name__,
            exc,
        )


def _record(
    store: RestartStore,
    state: State,
    *,
    failed: int,
    members: list[int],
    lost: list[int],
    times: RestartTimes,
) -> None:
    """Emit the ``inprocess_restart`` event (a queued, non-blocking write)."""
    faults = store.faults(failed, members)

    def global_rank(initial: int) -> int:
        key = f"{failed}/rank/{initial}"
        return int(store.store.get(key)) if store.store.check([key]) else initial

    ordered = sorted(faults.items(), key=lambda kv: (_ORDER.get(str(kv[1].get("kind")), 1), kv[0]))
    kind = str(ordered[0][1].get("kind")) if ordered else "exception"
    reason = "; ".join(f"rank {global_rank(r)}: {rec.get('reason')}" for r, rec in ordered)
    local = times.done - times.started
    first = min((float(rec["time"]) for rec in faults.values() if "time" in rec), default=None)
    # From the first fault report on any rank (one node's clock), never less than this rank's own.
    duration = local if first is None else max(local, time.time() - first)
    # A hang began a soft timeout before it was reported: the report dates its detection.
    timeout = ordered[0][1].get("timeout_s") if kind == "soft_timeout" else None
    extra = {} if timeout is None else {"timeout_s": float(timeout)}
    get_recorder().emit(
        "inprocess_restart",
        cause=_CAUSES.get(kind, kind),
        reason=reason or "a collective failed with no fault reported (a peer's connection closed)",
        ranks=sorted(global_rank(r) for r in faults),
        lost_ranks=sorted(global_rank(r) for r in lost),
        iteration=state.iteration,
        duration_s=round(duration, 6),
        phases=times.phases(),
        **extra,
    )
