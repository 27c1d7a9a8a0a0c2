"""One hang verdict for the whole job: every node's evidence, exchanged through the round's store.

A node's own verdict compares its local ranks only. When a rank of node 1 is stopped, the ranks of
node 0 wait for it in a collective and look like the only hung ones there, and node 1 has no
frame to compare; only all the ranks together name the culprit. So on a hang cycle:

1. the node whose monitor found a hang announces it in the round's store at once;
2. every node of the round publishes its ranks' evidence (global rank -> innermost main-thread
   frame, or null when the rank gave no dump) under its node rank. A node with no hang of its
   own, whose workers are stopped because of the failure elsewhere, first asks its monitors for
   its ranks' stacks;
3. every node waits, bounded, for the other nodes' evidence, judges all ranks with
   :func:`~resiliency.launcher.verdict.judge_frames` and logs the same job-wide verdict.

The keys live in the round's store namespace (see :mod:`resiliency.launcher.shared_state`), so a
later round never reads this one's evidence; one exchange per round (a restart is a new round).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from resiliency.launcher.cycle import Cycle
from resiliency.launcher.shared_state import SharedRoundState, StoreWaitTimeoutError, wait_keys
from resiliency.launcher.verdict import Frame, HangVerdict, innermost_frame, judge_frames

__all__ = ["EVIDENCE_SLACK_S", "JobHangExchange", "decode_evidence", "encode_evidence"]

logger = logging.getLogger(__name__)

_HANGS = "ft/hang/announced"  # counter: hangs found on any node this round
_EVIDENCE = "ft/hang/evidence/"  # + node rank: JSON, that node's ranks' innermost frames
#: Beyond the monitors' stack_dump_timeout: a node that learns of the hang late sees the failure
#: one monitor interval later, then waits stack_dump_timeout + 1 s for its own ranks' stacks.
EVIDENCE_SLACK_S = 2.0
# A node of a real job has at most a few dozen ranks: a bigger message is not evidence.
_MAX_EVIDENCE_BYTES = 1 << 20


def encode_evidence(node: int, restart: int, frames: Mapping[int, Frame | None]) -> str:
    """The JSON a node publishes: its node rank, restart count and every rank's frame."""
    ranks = {
        str(rank): None if f is None else {"file": f.filename, "line": f.lineno, "name": f.name}
        for rank, f in sorted(frames.items())
    }
    return json.dumps({"node": node, "restart": restart, "ranks": ranks}, separators=(",", ":"))


def decode_evidence(data: bytes | str) -> tuple[int, dict[int, Frame | None]]:
    """Validate and decode what :func:`encode_evidence` wrote.

    Returns:
        The node rank and its global rank -> frame (None: no dump).

    Raises:
        ValueError: the data is not well-formed evidence.
    """
    if len(data) > _MAX_EVIDENCE_BYTES:
        raise ValueError(f"{len(data)} bytes of evidence")
    message: Any = json.loads(data)
    if not isinstance(message, dict) or not isinstance(message.get("node"), int):
        raise ValueError("evidence is not an object with an integer 'node'")
    ranks = message.get("ranks")
    if not isinstance(ranks, dict):
        raise ValueError("evidence without a 'ranks' object")
    frames: dict[int, Frame | None] = {}
    for rank, frame in ranks.items():
        if frame is None:
            frames[int(rank)] = None
        elif (
            isinstance(frame, dict)
            and isinstance(frame.get("file"), str)
            and isinstance(frame.get("line"), int)
            and isinstance(frame.get("name"), str)
        ):
            frames[int(rank)] = Frame(frame["file"], frame["line"], frame["name"])
        else:
            raise ValueError(f"rank {rank}: a frame needs 'file', 'line' and 'name'")
    return message["node"], frames


class JobHangExchange:
    """This node's side of one round's job-wide hang verdict.

    Args:
        shared: the round's state (its store, this node's rank and the number of nodes).
        wait_s: the longest this node waits for the other nodes' evidence.
    """

    def __init__(self, shared: SharedRoundState, wait_s: float) -> None:
        self._shared = shared
        self._wait_s = wait_s
        self._announced = False
        self._published = False

    def announce(self) -> None:
        """A monitor of this node found a hang: the other nodes must contribute their evidence."""
        if not self._announced:
            self._announced = True
            self._shared.store.add(_HANGS, 1)

    def hang_in_round(self) -> bool:
        """True when a node of this round announced a hang (one store operation)."""
        return self._announced or int(self._shared.store.add(_HANGS, 0)) > 0

    def contribute(
        self,
        cycle: Cycle,
        poll_events: Callable[[], None],
        *,
        local: HangVerdict | None,
        restart: int,
    ) -> bool:
        """Publish this node's evidence when a hang happened anywhere in the round.

        Args:
            cycle: this node's cycle (its diagnosis is asked for stacks when it had no hang).
            poll_events: reads pending monitor events and feeds them to the diagnosis.
            local: this node's own verdict, None when none of its ranks hung.
            restart: this node's restart count (in the evidence, for whoever inspects the store).

        Returns:
            True when this node published (then :meth:`judge` gives the job-wide verdict).
        """
        if self._published or not self.hang_in_round():
            return False
        if local is None:
            # The failure is elsewhere; this node's ranks still wait where it stopped them.
            cycle.diagnosis.request_peer_stacks(cycle.connected)
            dumps = cycle.diagnosis.collect(cycle.ranks, poll_events)
            frames = {rank: innermost_frame(dumps.get(rank)) for rank in cycle.ranks.values()}
        else:
            known = {r: f for f, group in local.by_frame.items() for r in group}
            frames = {rank: known.get(rank) for rank in cycle.ranks.values()}
        shared = self._shared
        shared.store.set(f"{_EVIDENCE}{shared.rank}", encode_evidence(shared.rank, restart, frames))
        self._published = True
        return True

    def judge(self) -> HangVerdict:
        """Wait (bounded) for every node's evidence and judge all the ranks of the job."""
        shared = self._shared
        keys = {node: f"{_EVIDENCE}{node}" for node in range(shared.world)}
        try:
            wait_keys(shared.store, list(keys.values()), self._wait_s, "every node's hang evidence")
        except StoreWaitTimeoutError as exc:
            silent = [n for n, key in keys.items() if not shared.store.check([key])]
            logger.warning(
                "job-wide hang verdict: %s: no evidence from node(s) %s (their launcher is "
                "stopped, slow or gone; check their logs); judging without them",
                exc,
                ",".join(map(str, silent)),
            )
        frames: dict[int, Frame | None] = {}
        nodes: dict[int, int] = {}
        for node, key in keys.items():
            if not shared.store.check([key]):
                continue
            try:
                sender, evidence = decode_evidence(shared.store.get(key))
            except ValueError as exc:
                logger.error("job-wide hang verdict: dropped node %d's evidence: %s", node, exc)
                continue
            frames.update(evidence)
            nodes.update(dict.fromkeys(evidence, sender))
        return judge_frames(frames, nodes, label="job-wide hang verdict")
