"""Hang diagnosis of one restart cycle: every local rank's stacks, then one verdict.

When a monitor reports a hung rank, the other local ranks are usually waiting for it inside a
collective. Their monitors are asked for their stacks before the group is stopped (a monitor that
is already handling its own rank's hang answers with that hang's dump), and the verdict compares
the innermost frames of all of them (:func:`resiliency.launcher.verdict.analyze_hang`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from resiliency.ft import MonitorEvent
from resiliency.launcher._monitors import MonitorSet
from resiliency.launcher.verdict import HangVerdict, analyze_hang

__all__ = ["HangDiagnosis", "culprit_cause"]

logger = logging.getLogger(__name__)

# Beyond the monitors' own stack_dump_timeout: their loop period and the event round trip.
_DUMP_SLACK_S = 1.0
_POLL_S = 0.05
# The monitor's wait for the kernel to reap a worker after SIGKILL (resiliency.ft's HangAction).
_SIGKILL_WAIT_S = 5.0


class HangDiagnosis:
    """The hangs and stack dumps of one cycle, and the verdict drawn from them.

    Args:
        monitors: This node's rank monitors; they collect every dump.
        dump_timeout: The monitors' ``stack_dump_timeout``.
    """

    def __init__(self, monitors: MonitorSet, dump_timeout: float, grace_period: float) -> None:
        self.hangs: dict[int, MonitorEvent] = {}
        self.ended: dict[int, MonitorEvent] = {}
        self._monitors = monitors
        self._wait_s = dump_timeout + _DUMP_SLACK_S
        # The monitor's whole escalation: dump, grace period, SIGKILL and its wait for the reap.
        self._end_wait_s = dump_timeout + grace_period + _SIGKILL_WAIT_S + _DUMP_SLACK_S
        self._requested: set[int] = set()
        self._stacks: dict[int, str | None] = {}

    def add_hang(self, local_rank: int, event: MonitorEvent) -> bool:
        """Record a monitor's hang report (it carries the hung rank's dump).

        Returns:
            True when it is the first hang of the cycle.
        """
        first = not self.hangs
        self.hangs[local_rank] = event
        return first

    def add_ended(self, local_rank: int, event: MonitorEvent) -> bool:
        """Record a monitor's ``killed`` report: the hung rank is gone.

        Returns:
            True when it ends a hang of this cycle (not a late report about an earlier worker).
        """
        hang = self.hangs.get(local_rank)
        if hang is None or hang.pid != event.pid or local_rank in self.ended:
            return False
        self.ended[local_rank] = event
        how = f"its monitor's {event.signal}" if event.signal else "itself"
        logger.error("rank %s (pid %s), hung, is gone: ended by %s", event.rank, event.pid, how)
        return True

    def await_ends(self, poll_events: Callable[[], None]) -> list[int]:
        """Wait (bounded) until the monitor of every hung rank has ended it.

        The monitors own the escalation of a hang (termination signal, then SIGKILL after
        ``termination_grace_period``); stopping the workers before it ends would cancel it and
        leave the hung rank to torch's ``--workers-stop-timeout`` instead.

        Args:
            poll_events: Reads pending monitor events and feeds them back to this object.

        Returns:
            The local ranks whose monitor did not report the end in time.
        """
        deadline = time.monotonic() + self._end_wait_s
        while (pending := sorted(set(self.hangs) - set(self.ended))) and (
            time.monotonic() < deadline
        ):
            time.sleep(_POLL_S)
            poll_events()
        return pending

    def add_stacks(self, local_rank: int, dump: str | None) -> None:
        """Record a monitor's answer to a stack-dump request."""
        self._stacks[local_rank] = dump

    def request_peer_stacks(self, peers: Iterable[int]) -> None:
        """Ask the monitors of ``peers`` for their ranks' stacks (answers come as events)."""
        for local_rank in peers:
            if self._monitors.request_stack_dump(local_rank):
                self._requested.add(local_rank)

    def collect(
        self, ranks: Mapping[int, int], poll_events: Callable[[], None]
    ) -> dict[int, str | None]:
        """Wait (bounded) for the requested stacks; those that do not come are logged.

        Args:
            ranks: Local rank -> global rank of this cycle's workers.
            poll_events: Reads pending monitor events and feeds them back to this object.

        Returns:
            Global rank -> stack dump (None: the monitor answered without one) of every rank
            whose monitor answered or reported it hung.
        """
        deadline = time.monotonic() + self._wait_s
        while (self._requested - set(self._stacks) - set(self.hangs)) and (
            time.monotonic() < deadline
        ):
            time.sleep(_POLL_S)
            poll_events()
        if missing := sorted(self._requested - set(self._stacks) - set(self.hangs)):
            logger.warning(
                "no answer to the stack-dump request from the monitor(s) of local rank(s) %s "
                "within %.1f s (busy or gone); going on without their stacks",
                ",".join(map(str, missing)),
                self._wait_s,
            )
        dumps: dict[int, str | None] = {}
        for local_rank, text in self._stacks.items():
            dumps[ranks.get(local_rank, local_rank)] = text
        for local_rank, event in self.hangs.items():
            dumps[ranks.get(local_rank, local_rank)] = event.stack_dump
        return dumps

    def verdict(
        self, ranks: Mapping[int, int], poll_events: Callable[[], None]
    ) -> HangVerdict | None:
        """Wait (bounded) for the requested stacks, then compare every rank's innermost frame.

        Args:
            ranks: Local rank -> global rank of this cycle's workers.
            poll_events: Reads pending monitor events and feeds them back to this object.

        Returns:
            The verdict (its ``summary`` is the line to log), or None when the cycle had no hang.
        """
        if not self.hangs:
            return None
        return analyze_hang(self.collect(ranks, poll_events))


def culprit_cause(
    verdict: HangVerdict, ranks: Mapping[int, int], pids: Mapping[int, int]
) -> str | None:
    """The root cause of a hang in words, naming the verdict's culprit (None when it has none).

    The monitors report whichever rank's timer expires first, usually a rank that waits for the
    culprit; the launcher's last line and ``--exit-status-file`` must name the culprit instead.

    Args:
        verdict: The cycle's hang verdict.
        ranks: Local rank -> global rank of this cycle's workers.
        pids: Local rank -> pid.
    """
    if not verdict.culprits:
        return None
    local = {rank: lr for lr, rank in ranks.items()}

    def who(rank: int) -> str:
        parts = [f"node {verdict.nodes[rank]}"] if rank in verdict.nodes else []
        if rank in local:
            parts += [f"local rank {local[rank]}", f"pid {pids.get(local[rank])}"]
        return f"rank {rank} ({', '.join(parts)})" if parts else f"rank {rank}"

    frames = {r: frame for frame, group in verdict.by_frame.items() for r in group}

    def at(rank: int) -> str:
        if rank in frames:
            return f"at {frames[rank]}"
        return "with no stack dump (stopped, stuck in the kernel or gone)"

    where = "; ".join(f"{who(r)} {at(r)}" for r in verdict.culprits)
    text = f"likely culprit of the hang: {where}"
    if verdict.common_frame is not None:
        peers = verdict.by_frame.get(verdict.common_frame, ())
        noun = "rank" if len(peers) == 1 else "ranks"
        text += f", while {noun} {','.join(map(str, peers))} waited at {verdict.common_frame}"
    return text
