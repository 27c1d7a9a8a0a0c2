"""The monitor thread of one iteration: notice a fault, abort, interrupt, and escalate.

Faults it notices: a peer's report in the store, this rank's own main thread stalled past
``soft_timeout``, a peer's heartbeat silent past ``heartbeat_timeout``. On the first one it
runs the ``abort`` callback (which ends pending collectives) and interrupts the main thread.
If the main thread has still not come back to the wrapper ``hard_timeout - soft_timeout``
later, the rank cannot be aborted in-process: its stacks are dumped and it is terminated. That
holds whether or not the interruption was delivered: a main thread that got
``RankShouldRestart`` and then blocks in the user's ``except`` or ``finally`` (or swallowed it
and hangs) is terminated like one the signal never reached. Under
``ft-launcher --ft-inprocess-respawn`` it first asks the launcher to respawn it alone (the
others wait for it); otherwise it is reported gone and the others go on without it.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from resiliency.inprocess._interrupt import Interrupter
from resiliency.inprocess._liveness import Liveness
from resiliency.inprocess._progress import Progress
from resiliency.inprocess._restart_store import RestartStore
from resiliency.inprocess._unabortable import request_respawn
from resiliency.inprocess.state import FrozenState

log = logging.getLogger(__name__)


def main_thread_location() -> str:
    """Where the main thread is, as ``file:line in function`` (innermost Python frame)."""
    ident = threading.main_thread().ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def monitor_timeouts(wrapper_timeouts: dict[str, float]) -> dict[str, float]:
    """The monitor's timeouts (seconds), picked from the Wrapper's."""
    return {
        "interval": wrapper_timeouts["monitor_thread_interval"],
        "soft": wrapper_timeouts["soft_timeout"],
        "hard": wrapper_timeouts["hard_timeout"],
        "heartbeat": wrapper_timeouts["heartbeat_timeout"],
        "grace": wrapper_timeouts["termination_grace_time"],
    }


class Monitor(threading.Thread):
    """Watch one iteration of one rank (see the module docstring).

    Args:
        store: the wrapper's keys on a client for this thread alone.
        state: the rank's state for this iteration.
        peers: initial ranks of the other ranks in this iteration.
        progress: the main thread's progress.
        interrupter: interrupts the main thread.
        abort: the ``abort`` callback (or None).
        atomic_lock: held by the main thread inside ``CallWrapper.atomic()``.
        timeouts: seconds: ``interval``, ``soft``, ``hard``, ``heartbeat``, ``grace``.
        hosting_store: this rank hosts the wrapper's store (it cannot be respawned alone).
    """

    def __init__(
        self,
        *,
        store: RestartStore,
        state: FrozenState,
        peers: list[int],
        progress: Progress,
        interrupter: Interrupter,
        abort: Callable[[FrozenState], Any] | None,
        atomic_lock: threading.RLock,
        timeouts: dict[str, float],
        hosting_store: bool = False,
    ) -> None:
        super().__init__(name=f"inprocess-monitor-{state.initial_rank}", daemon=True)
        self.store = store
        self.state = state
        self.peers = peers
        self.progress = progress
        self.interrupter = interrupter
        self.abort = abort
        self.atomic_lock = atomic_lock
        self.timeouts = timeouts
        self.hosting_store = hosting_store
        self.liveness = Liveness(store, timeouts["heartbeat"])
        self.cause: str | None = None
        self.aborted = threading.Event()
        self._halt = threading.Event()
        self._returned = threading.Event()  # the main thread is back in the wrapper
        self._triggered_at: float | None = None

    def main_thread_returned(self) -> None:
        """The main thread left the wrapped function (returned or raised) and is back in
        the wrapper, whose own waits have deadlines: never terminate it from now on."""
        self._returned.set()

    def stop(self) -> None:
        """Stop watching (the main thread left the iteration)."""
        self._returned.set()
        self._halt.set()
        self.join(self.timeouts["hard"])

    def run(self) -> None:
        """Watch until stopped; a failure of the monitor itself is logged, never silent."""
        try:
            while not self._halt.wait(self.timeouts["interval"]):
                self._tick()
        except Exception:
            log.exception(
                "rank %d: iteration %d: the monitor thread failed; faults are no longer "
                "detected on this rank until the next iteration",
                self.state.rank,
                self.state.iteration,
            )

    def _tick(self) -> None:
        if self._triggered_at is not None:
            self._escalate()
            return
        self.progress.poke()
        it = self.state.iteration
        if self.store.fault_count(it):
            faults = self.store.faults(it, [*self.peers, self.state.initial_rank])
            summary = "; ".join(f"rank {r}: {rec.get('reason')}" for r, rec in faults.items())
            self._trigger(f"fault reported in the store ({summary or 'record not yet written'})")
            return
        stalled = self.progress.stalled_for()
        if stalled > self.timeouts["soft"]:
            where = main_thread_location()
            reason = (
                f"no progress for {stalled:.1f} s (soft_timeout {self.timeouts['soft']:g} s); "
                f"main thread at {where}"
            )
            record = {
                "kind": "soft_timeout",
                "reason": reason,
                "where": where,
                "timeout_s": self.timeouts["soft"],
            }
            self.store.report_fault(it, self.state.initial_rank, record)
            self._trigger(reason)
            return
        dead = self.liveness.stale(self.peers)
        if dead:
            for rank, silent in dead.items():
                why = f"no heartbeat for {silent:.1f} s (heartbeat_timeout)"
                self.store.mark_terminated(rank, why)
                self.store.report_fault(it, rank, {"kind": "heartbeat", "reason": why})
            self._trigger(f"rank(s) {sorted(dead)} stopped sending heartbeats")

    def _trigger(self, cause: str) -> None:
        self.cause = cause
        self._triggered_at = time.monotonic()
        # Where this rank's main thread sits tells the culprit (not in a collective) apart.
        log.warning(
            "rank %d: iteration %d: fault: %s; aborting (this rank's main thread at %s)",
            self.state.rank,
            self.state.iteration,
            cause,
            main_thread_location(),
        )
        got_lock = self.atomic_lock.acquire(timeout=self.timeouts["hard"])
        if not got_lock:
            log.warning(
                "rank %d: the main thread stayed inside CallWrapper.atomic() for %g s; "
                "aborting anyway",
                self.state.rank,
                self.timeouts["hard"],
            )
        try:
            started = time.monotonic()
            if self.abort is not None:
                try:
                    self.abort(self.state)
                except Exception:
                    log.exception("rank %d: the abort callback failed", self.state.rank)
            self.aborted.set()
            log.info("rank %d: abort took %.3f s", self.state.rank, time.monotonic() - started)
            self.interrupter.request(cause)
        finally:
            if got_lock:
                self.atomic_lock.release()

    def _escalate(self) -> None:
        """The main thread did not come back to the wrapper in time: terminate this rank.

        Whether the restart request reached it does not matter (the interrupter disarms once
        it did): only the main thread's return to the wrapper ends the watch.
        """
        assert self._triggered_at is not None
        waited = time.monotonic() - self._triggered_at
        if self._returned.is_set() or waited < self.timeouts["hard"] - self.timeouts["soft"]:
            return
        where = main_thread_location()
        got = (
            "it got the restart request but did not come back to the wrapper; "
            if self.interrupter.delivered
            else ""
        )
        reason = (
            f"could not be aborted in-process: {got}the main thread is still at {where} "
            f"{waited:.1f} s after the abort (hard_timeout {self.timeouts['hard']:g} s)"
        )
        log.error("rank %d: %s; dumping stacks and terminating", self.state.rank, reason)
        faulthandler.dump_traceback(all_threads=True)
        if request_respawn(f"rank {self.state.rank} {reason}", hosting_store=self.hosting_store):
            # The others keep this rank a member and wait for its respawn at the barrier.
            log.error(
                "rank %d (initial %d): ft-launcher will respawn it alone; the other ranks wait "
                "for it at the restart barrier of iteration %d",
                self.state.rank,
                self.state.initial_rank,
                self.state.iteration,
            )
        else:
            try:
                self.store.mark_terminated(self.state.initial_rank, reason)
            except Exception as exc:
                log.error("rank %d: could not record the termination: %s", self.state.rank, exc)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(self.timeouts["grace"])
        os.kill(os.getpid(), signal.SIGKILL)
