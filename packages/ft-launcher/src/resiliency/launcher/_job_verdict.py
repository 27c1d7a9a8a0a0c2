"""One hang verdict for the whole job: every node's evidence, exchanged through the round's store.

A node's own verdict compares its local ranks only. When a rank of node 1 is stopped, the ranks of
node 0 wait for it in a collective and look like the only hung ones there, and node 1 has no
frame to compare; only all the ranks together name the culprit. So on a hang cycle:

1. the node whose monitor found a hang announces it in the round's store at once;
2. every node of the round publishes its ranks' evidence (global rank -> innermost main-thread
   frame, or null when the rank gave no dump) under its node rank. A node with no hang of its
   own, whose workers are stopped because of the failure elsewhere, first asks its monitors for
   its ranks' stacks;
3. node 0 waits, bounded, for the other nodes' evidence, reads it all at once, judges all ranks
   with :func:`~resiliency.launcher.verdict.judge_frames` and publishes the verdict; every other
   node reads that one verdict (the verdict is reached once, and no node reads every node's
   evidence but the judge: at 1,000 nodes that is a few KB per node instead of 1 MB). A node
   that sees no verdict in time (node 0 is gone or stuck) judges the evidence itself.

The keys live in the round's store namespace (see :mod:`resiliency.launcher._shared_state`), so a
later round never reads this one's evidence; one exchange per round (a restart is a new round).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from resiliency.launcher._cycle import Cycle
from resiliency.launcher._shared_state import SharedRoundState, StoreWaitTimeoutError, wait_keys
from resiliency.launcher.verdict import Frame, HangVerdict, innermost_frame, judge_frames

__all__ = [
    "EVIDENCE_SLACK_S",
    "VERDICT_SLACK_S",
    "JobHangExchange",
    "decode_evidence",
    "decode_verdict",
    "encode_evidence",
    "encode_verdict",
]

logger = logging.getLogger(__name__)

_HANGS = "ft/hang/announced"  # counter: hangs found on any node this round
_EVIDENCE = "ft/hang/evidence/"  # + node rank: JSON, that node's ranks' innermost frames
_VERDICT = "ft/hang/verdict"  # JSON: the verdict node 0 reached from every node's evidence
_JUDGE = 0  # the node that judges: every round has a node 0
#: How much longer than the judge's own wait for evidence a node waits for the verdict: the
#: judge's read of every node's evidence and its judging (0.12 s at 1,000 nodes x 8 ranks).
VERDICT_SLACK_S = 5.0
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


def _frame(raw: Any) -> Frame:
    if not (isinstance(raw, list) and len(raw) == 3 and isinstance(raw[1], int)):
        raise ValueError(f"not a frame: {raw!r}")
    return Frame(str(raw[0]), raw[1], str(raw[2]))


def encode_verdict(verdict: HangVerdict) -> str:
    """The JSON the judge publishes: the verdict, with the nodes of its culprits and no-dumps."""
    named = set(verdict.culprits) | set(verdict.no_dump)
    common = verdict.common_frame
    by_frame = [[[f.filename, f.lineno, f.name], list(r)] for f, r in verdict.by_frame.items()]
    return json.dumps(
        {
            "by_frame": by_frame,
            "common": None if common is None else [common.filename, common.lineno, common.name],
            "culprits": list(verdict.culprits),
            "no_dump": list(verdict.no_dump),
            "summary": verdict.summary,
            "nodes": {str(r): n for r, n in verdict.nodes.items() if r in named},
        },
        separators=(",", ":"),
    )


def decode_verdict(data: bytes | str) -> HangVerdict:
    """Validate and decode what :func:`encode_verdict` wrote.

    Raises:
        ValueError: the data is not a well-formed verdict.
    """
    message: Any = json.loads(data)
    try:
        return HangVerdict(
            by_frame={_frame(f): tuple(int(r) for r in ranks) for f, ranks in message["by_frame"]},
            common_frame=None if message["common"] is None else _frame(message["common"]),
            culprits=tuple(int(r) for r in message["culprits"]),
            no_dump=tuple(int(r) for r in message["no_dump"]),
            summary=str(message["summary"]),
            nodes={int(r): int(n) for r, n in message["nodes"].items()},
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed verdict: {exc!r}") from exc


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
            try:
                self._shared.exchange.add(_HANGS, 1)
            except RuntimeError as exc:  # the round's store went with its host
                logger.error("job-wide hang verdict: cannot announce the hang: %s", exc)

    def hang_in_round(self) -> bool:
        """True when a node of this round announced a hang (one store operation)."""
        return self._announced or int(self._shared.exchange.add(_HANGS, 0)) > 0

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
        try:
            if self._published or not self.hang_in_round():
                return False
        except RuntimeError as exc:  # node 0, the store's host, is gone: judge alone
            logger.error(
                "job-wide hang verdict: the round's store is unreachable (%s); this node's "
                "ranks are judged alone",
                exc,
            )
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
        evidence = encode_evidence(shared.rank, restart, frames)
        try:
            shared.exchange.set(f"{_EVIDENCE}{shared.rank}", evidence)
        except RuntimeError as exc:  # the store went with its host between two operations
            logger.error("job-wide hang verdict: the round's store is unreachable (%s)", exc)
            return False
        self._published = True
        return True

    def judge(self) -> HangVerdict:
        """The job-wide verdict: node 0 reaches it from every node's evidence, the others read it.

        At most five store operations per node (announce or look, publish, then node 0: wait,
        one read of every node's evidence, publish the verdict; the others: wait, read it);
        ``benchmarks/bench_job_verdict.py`` measures it at 1,000 nodes.
        """
        shared = self._shared
        if shared.rank != _JUDGE:
            try:
                wait_keys(
                    shared.exchange,
                    [_VERDICT],
                    self._wait_s + VERDICT_SLACK_S,
                    "node 0's job-wide hang verdict",
                )
                return decode_verdict(shared.exchange.get(_VERDICT))
            except StoreWaitTimeoutError as exc:
                logger.warning(
                    "job-wide hang verdict: %s (node 0's launcher is stopped, slow or gone); "
                    "judging every node's evidence here",
                    exc,
                )
            except ValueError as exc:
                logger.error("job-wide hang verdict: node 0's verdict is malformed: %s", exc)
        verdict = self._judge_evidence()
        if shared.rank == _JUDGE:
            shared.exchange.set(_VERDICT, encode_verdict(verdict))
        return verdict

    def _judge_evidence(self) -> HangVerdict:
        """Wait (bounded) for every node's evidence and judge all the ranks of the job."""
        shared = self._shared
        keys = {node: f"{_EVIDENCE}{node}" for node in range(shared.world)}
        present = list(keys)
        try:
            wait_keys(
                shared.exchange, list(keys.values()), self._wait_s, "every node's hang evidence"
            )
        except StoreWaitTimeoutError as exc:
            silent = [n for n, key in keys.items() if not shared.exchange.check([key])]
            present = [n for n in keys if n not in silent]
            logger.warning(
                "job-wide hang verdict: %s: no evidence from node(s) %s (their launcher is "
                "stopped, slow or gone; check their logs); judging without them",
                exc,
                ",".join(map(str, silent)),
            )
        # One read for every node's evidence: a get per key would cost a round trip per node.
        values = shared.exchange.multi_get([keys[n] for n in present]) if present else []
        frames: dict[int, Frame | None] = {}
        nodes: dict[int, int] = {}
        for node, data in zip(present, values, strict=True):
            try:
                sender, evidence = decode_evidence(data)
            except ValueError as exc:
                logger.error("job-wide hang verdict: dropped node %d's evidence: %s", node, exc)
                continue
            frames.update(evidence)
            nodes.update(dict.fromkeys(evidence, sender))
        return judge_frames(frames, nodes, label="job-wide hang verdict")
