"""Hang diagnosis of one restart cycle: every local rank's stacks, then one verdict.

When a monitor reports a hung rank, the other local ranks are usually waiting for it inside a
collective. Their monitors are asked for their stacks before the group is stopped (a monitor that
is already handling its own rank's hang answers with that hang's dump), and the verdict compares
the innermost frames of all of them (:func:`resiliency.launcher.verdict.analyze_hang`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from resiliency.ft import MonitorEvent
from resiliency.launcher.monitors import MonitorSet
from resiliency.launcher.verdict import HangVerdict, analyze_hang

__all__ = ["HangDiagnosis", "culprit_cause"]

# Beyond the monitors' own stack_dump_timeout: their loop period and the event round trip.
_DUMP_SLACK_S = 1.0
_POLL_S = 0.05


class HangDiagnosis:
    """The hangs and stack dumps of one cycle, and the verdict drawn from them.

    Args:
        monitors: This node's rank monitors; they collect every dump.
        dump_timeout: The monitors' ``stack_dump_timeout``.
    """

    def __init__(self, monitors: MonitorSet, dump_timeout: float) -> None:
        self.hangs: dict[int, MonitorEvent] = {}
        self._monitors = monitors
        self._wait_s = dump_timeout + _DUMP_SLACK_S
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

    def add_stacks(self, local_rank: int, dump: str | None) -> None:
        """Record a monitor's answer to a stack-dump request."""
        self._stacks[local_rank] = dump

    def request_peer_stacks(self, peers: Iterable[int]) -> None:
        """Ask the monitors of ``peers`` for their ranks' stacks (answers come as events)."""
        for local_rank in peers:
            if self._monitors.request_stack_dump(local_rank):
                self._requested.add(local_rank)

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
        deadline = time.monotonic() + self._wait_s
        while (self._requested - set(self._stacks) - set(self.hangs)) and (
            time.monotonic() < deadline
        ):
            time.sleep(_POLL_S)
            poll_events()
        dumps: dict[int, str | None] = {}
        for local_rank, text in self._stacks.items():
            dumps[ranks.get(local_rank, local_rank)] = text
        for local_rank, event in self.hangs.items():
            dumps[ranks.get(local_rank, local_rank)] = event.stack_dump
        return analyze_hang(dumps)


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
        if rank not in local:
            return f"rank {rank}"
        return f"rank {rank} (local rank {local[rank]}, pid {pids.get(local[rank])})"

    frames = {r: frame for frame, group in verdict.by_frame.items() for r in group}
    where = "; ".join(f"{who(r)} at {frames[r]}" for r in verdict.culprits)
    text = f"likely culprit of the hang: {where}"
    if verdict.common_frame is not None:
        peers = verdict.by_frame.get(verdict.common_frame, ())
        noun = "rank" if len(peers) == 1 else "ranks"
        text += f", while {noun} {','.join(map(str, peers))} waited at {verdict.common_frame}"
    return text
