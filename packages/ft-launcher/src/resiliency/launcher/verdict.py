"""Hang diagnosis: which ranks were stuck at the same frame, and which rank was elsewhere.

When rank monitors kill hung ranks they hand the launcher each rank's Python stack dump (the text
``faulthandler`` writes). In a collective hang most ranks wait at the same innermost frame (inside
the collective) while the culprit is somewhere else (a stuck data loader, a dead lock, a
``sleep``), or gave no dump at all (stopped, stuck in the kernel, gone). This module is pure: text
or frames in, verdict out. :func:`judge_frames` holds the rules over every rank's innermost frame,
so one node's ranks (:func:`analyze_hang`) and the whole job's (the ranks of every node, see
:mod:`resiliency.launcher._job_verdict`) are judged alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "Frame",
    "HangVerdict",
    "ThreadStack",
    "analyze_hang",
    "innermost_frame",
    "judge_frames",
    "parse_stack_dump",
]

_THREAD_RE = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)[^\n]*\(most recent call first\):"
)
_STACK_RE = re.compile(r"^Stack \(most recent call first\):")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<name>.+?)\s*$')


#: Where a rank waits for its peers: inside torch.distributed (a collective, a barrier, the
#: store), in the autograd engine (DDP's gradient all-reduce runs inside backward()), or in the
#: emergency checkpoint's agreement (``EmergencyCheckpoint.should_stop`` agrees on a stop step
#: with every rank through the store each step). A rank stopped anywhere else while others wait
#: there is what they wait for.
_WAITING_PATHS = (
    "/torch/distributed/",
    "/torch/autograd/",
    "/torch/futures/",
    "/resiliency/checkpoint/_emergency/agreement.py",
)


@dataclass(frozen=True)
class Frame:
    """One Python frame of a stack dump."""

    filename: str
    lineno: int
    name: str

    def __str__(self) -> str:
        short = self.filename.rsplit("/", 1)[-1]
        return f"{self.name} ({short}:{self.lineno})"

    @property
    def waits_for_peers(self) -> bool:
        """True when this innermost frame waits for peers (:data:`_WAITING_PATHS`)."""
        path = self.filename.replace("\\", "/")
        return any(part in path for part in _WAITING_PATHS)


@dataclass(frozen=True)
class ThreadStack:
    """The frames of one thread, innermost first, as ``faulthandler`` prints them."""

    thread_id: str
    current: bool
    frames: tuple[Frame, ...]


def parse_stack_dump(text: str) -> list[ThreadStack]:
    """Parse a ``faulthandler`` dump (``dump_traceback(all_threads=True)`` format).

    Args:
        text: the dump; unrelated lines (log output, truncation markers) are ignored.

    Returns:
        One :class:`ThreadStack` per thread block found, in file order. Empty if none.
    """
    stacks: list[ThreadStack] = []
    thread_id: str | None = None
    current = False
    frames: list[Frame] = []

    def flush() -> None:
        if thread_id is not None:
            stacks.append(ThreadStack(thread_id, current, tuple(frames)))

    for line in text.splitlines():
        header = _THREAD_RE.match(line)
        if header or _STACK_RE.match(line):
            flush()
            thread_id = header.group(2) if header else "main"
            current = bool(header and header.group(1) == "Current thread") or not header
            frames = []
            continue
        frame = _FRAME_RE.match(line)
        if frame and thread_id is not None:
            frames.append(Frame(frame["file"], int(frame["line"]), frame["name"]))
    flush()
    return stacks


def _main_stack(stacks: list[ThreadStack]) -> ThreadStack | None:
    """Pick the thread that ran the training loop: the one whose outermost frame is <module>."""
    with_frames = [s for s in stacks if s.frames]
    for stack in with_frames:
        if stack.frames[-1].name == "<module>":
            return stack
    for stack in with_frames:
        if stack.current:
            return stack
    return with_frames[0] if with_frames else None


@dataclass(frozen=True)
class HangVerdict:
    """The outcome of :func:`judge_frames` (and :func:`analyze_hang`).

    Attributes:
        by_frame: innermost main-thread frame -> ranks stopped there (sorted).
        common_frame: the frame the waiting ranks were stuck at, if the verdict found one.
        culprits: ranks that were elsewhere (or gave no dump) while the others waited.
        no_dump: ranks for which no usable stack dump was available.
        summary: one human-readable line for the log.
        nodes: global rank -> node (group rank), when the verdict covers several nodes.
    """

    by_frame: Mapping[Frame, tuple[int, ...]]
    common_frame: Frame | None
    culprits: tuple[int, ...]
    no_dump: tuple[int, ...]
    summary: str = field(default="")
    nodes: Mapping[int, int] = field(default_factory=dict)


def _ranks(ranks: Iterable[int]) -> str:
    ranks = list(ranks)
    noun = "rank" if len(ranks) == 1 else "ranks"
    return f"{noun} {','.join(str(r) for r in ranks)}"


def _who(ranks: Iterable[int], nodes: Mapping[int, int]) -> str:
    """The ranks in words, each group followed by its node when the node is known."""
    by_node: dict[int | None, list[int]] = {}
    for rank in sorted(ranks):
        by_node.setdefault(nodes.get(rank), []).append(rank)
    if None in by_node or not nodes:
        return _ranks(sorted(ranks))
    return ", ".join(f"{_ranks(group)} (node {node})" for node, group in by_node.items())


def innermost_frame(dump: str | None) -> Frame | None:
    """The innermost frame of the training loop's thread in a ``faulthandler`` dump.

    Args:
        dump: the dump text; None or empty when the rank gave none.

    Returns:
        The frame, or None when the text holds no usable stack.
    """
    stack = _main_stack(parse_stack_dump(dump or ""))
    return stack.frames[0] if stack is not None else None


def analyze_hang(dumps: Mapping[int, str | None]) -> HangVerdict:
    """Compare the innermost main-thread frame of every rank and name the likely culprit.

    Args:
        dumps: global rank -> its stack dump text (None or empty when the rank gave none).

    Returns:
        The verdict of :func:`judge_frames`; ``summary`` is always set.
    """
    return judge_frames({rank: innermost_frame(text) for rank, text in dumps.items()})


def judge_frames(
    frames: Mapping[int, Frame | None],
    nodes: Mapping[int, int] | None = None,
    label: str = "hang verdict",
) -> HangVerdict:
    """Name the likely culprit of a hang from every rank's innermost main-thread frame.

    The rules, in order (each is deterministic; ties go to the lowest rank):

    1. Ranks stopped outside any collective while others wait in one are the culprits.
    2. When every rank that gave a dump waits in a collective, the ranks without a dump (stopped,
       stuck in the kernel, gone) are the culprits: they are what the others wait for.
    3. Otherwise the frame most ranks share is the waiting one, the ranks elsewhere the culprits.

    Args:
        frames: global rank -> its innermost main-thread frame (None: no usable dump).
        nodes: global rank -> node; when given, culprits are named with their node.
        label: what the summary starts with.

    Returns:
        The verdict; ``summary`` is always set.
    """
    where = dict(nodes or {})
    by_frame: dict[Frame, list[int]] = {}
    no_dump: list[int] = []
    for rank in sorted(frames):
        frame = frames[rank]
        if frame is None:
            no_dump.append(rank)
        else:
            by_frame.setdefault(frame, []).append(rank)

    frozen = {frame: tuple(ranks) for frame, ranks in by_frame.items()}
    # Largest group first; ties broken by the lowest rank so the verdict is deterministic.
    ordered = sorted(frozen.items(), key=lambda item: (-len(item[1]), item[1][0]))
    missing = tuple(no_dump)
    tail = f"; no stack dump from {_ranks(no_dump)}" if no_dump else ""

    def verdict(common: Frame | None, culprits: tuple[int, ...], text: str) -> HangVerdict:
        return HangVerdict(frozen, common, culprits, missing, f"{label}: {text}", where)

    if not ordered:
        return verdict(None, (), f"no stack dumps{tail}")

    waiting = [(f, r) for f, r in ordered if f.waits_for_peers]
    elsewhere = [(f, r) for f, r in ordered if not f.waits_for_peers]
    waits = "; ".join(f"{_ranks(r)} stuck at {f}" for f, r in waiting)
    if waiting and elsewhere:  # rule 1
        culprits = tuple(sorted(r for _, ranks in elsewhere for r in ranks))
        others = "; ".join(f"{_ranks(r)} elsewhere at {f}" for f, r in elsewhere)
        text = f"{waits}; {others} -> likely culprit: {_who(culprits, where)}{tail}"
        return verdict(waiting[0][0], culprits, text)
    if waiting and no_dump:  # rule 2
        text = f"{waits}{tail} -> likely culprit: {_who(missing, where)}"
        return verdict(waiting[0][0], missing, text)

    top_frame, top_ranks = ordered[0]
    if len(ordered) == 1:
        stuck = f"{_ranks(top_ranks)} stuck at {top_frame}"
        if len(top_ranks) > 1:
            # One node's view cannot see the other nodes; the job-wide view can.
            scope = (
                "local rank stands out (look at other nodes or below Python)"
                if nodes is None
                else "rank of the job stands out (look below Python)"
            )
            stuck = (
                f"all dumped {_ranks(top_ranks)} stuck at the same frame {top_frame}; no {scope}"
            )
        return verdict(None, (), f"{stuck}{tail}")

    if len(top_ranks) == 1:
        parts = "; ".join(f"{_ranks(r)} at {f}" for f, r in ordered)
        return verdict(None, (), f"every rank stopped at a different frame ({parts}){tail}")

    culprits = tuple(sorted(r for _, ranks in ordered[1:] for r in ranks))  # rule 3
    others = "; ".join(f"{_ranks(r)} elsewhere at {f}" for f, r in ordered[1:])
    text = (
        f"{_ranks(top_ranks)} stuck at {top_frame}; {others} "
        f"-> likely culprit: {_who(culprits, where)}{tail}"
    )
    return verdict(top_frame, culprits, text)
