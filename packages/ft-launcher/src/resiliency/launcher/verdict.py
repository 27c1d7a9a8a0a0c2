"""Hang diagnosis: which ranks were stuck at the same frame, and which rank was elsewhere.

When rank monitors kill hung ranks they hand the launcher each rank's Python stack dump (the text
``faulthandler`` writes). In a collective hang most ranks wait at the same innermost frame (inside
the collective) while the culprit is somewhere else (a stuck data loader, a dead lock, a
``sleep``). This module is pure: text in, verdict out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Frame", "HangVerdict", "ThreadStack", "analyze_hang", "parse_stack_dump"]

_THREAD_RE = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)[^\n]*\(most recent call first\):"
)
_STACK_RE = re.compile(r"^Stack \(most recent call first\):")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<name>.+?)\s*$')


#: Where a rank waits for its peers: inside torch.distributed (a collective, a barrier, the
#: store), or in the autograd engine (DDP's gradient all-reduce runs inside backward()). A rank
#: stopped anywhere else while others wait there is what they wait for.
_WAITING_PATHS = ("/torch/distributed/", "/torch/autograd/", "/torch/futures/")


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
        """True when this innermost frame is inside torch.distributed or the autograd engine."""
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
    """The outcome of :func:`analyze_hang`.

    Attributes:
        by_frame: innermost main-thread frame -> ranks stopped there (sorted).
        common_frame: the frame most ranks were stuck at, if at least two ranks shared it.
        culprits: ranks that were elsewhere while the others waited at ``common_frame``.
        no_dump: ranks for which no usable stack dump was available.
        summary: one human-readable line for the log.
    """

    by_frame: Mapping[Frame, tuple[int, ...]]
    common_frame: Frame | None
    culprits: tuple[int, ...]
    no_dump: tuple[int, ...]
    summary: str = field(default="")


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    noun = "rank" if len(ranks) == 1 else "ranks"
    return f"{noun} {','.join(str(r) for r in ranks)}"


def analyze_hang(dumps: Mapping[int, str | None]) -> HangVerdict:
    """Compare the innermost main-thread frame of every rank and name the likely culprit.

    Args:
        dumps: global rank -> its stack dump text (None or empty when the rank gave none).

    Returns:
        The verdict; ``summary`` is always set.
    """
    by_frame: dict[Frame, list[int]] = {}
    no_dump: list[int] = []
    for rank in sorted(dumps):
        stack = _main_stack(parse_stack_dump(dumps[rank] or ""))
        if stack is None:
            no_dump.append(rank)
        else:
            by_frame.setdefault(stack.frames[0], []).append(rank)

    frozen = {frame: tuple(ranks) for frame, ranks in by_frame.items()}
    # Largest group first; ties broken by the lowest rank so the verdict is deterministic.
    ordered = sorted(frozen.items(), key=lambda item: (-len(item[1]), item[1][0]))
    tail = f"; no stack dump from {_ranks(no_dump)}" if no_dump else ""

    if not ordered:
        return HangVerdict({}, None, (), tuple(no_dump), f"hang verdict: no stack dumps{tail}")

    split = _split_by_waiting(ordered, tuple(no_dump), tail)
    if split is not None:
        return split
    top_frame, top_ranks = ordered[0]
    if len(ordered) == 1:
        where = f"{_ranks(top_ranks)} stuck at {top_frame}"
        if len(top_ranks) > 1:
            where = (
                f"all dumped {_ranks(top_ranks)} stuck at the same frame {top_frame}; "
                "no local rank stands out (look at other nodes or below Python)"
            )
        return HangVerdict(frozen, None, (), tuple(no_dump), f"hang verdict: {where}{tail}")

    if len(top_ranks) == 1:
        parts = "; ".join(f"{_ranks(r)} at {f}" for f, r in ordered)
        summary = f"hang verdict: every rank stopped at a different frame ({parts}){tail}"
        return HangVerdict(frozen, None, (), tuple(no_dump), summary)

    culprits = tuple(sorted(r for _, ranks in ordered[1:] for r in ranks))
    elsewhere = "; ".join(f"{_ranks(r)} elsewhere at {f}" for f, r in ordered[1:])
    summary = (
        f"hang verdict: {_ranks(top_ranks)} stuck at {top_frame}; {elsewhere} "
        f"-> likely culprit: {_ranks(list(culprits))}{tail}"
    )
    return HangVerdict(frozen, top_frame, culprits, tuple(no_dump), summary)


def _split_by_waiting(
    ordered: list[tuple[Frame, tuple[int, ...]]], no_dump: tuple[int, ...], tail: str
) -> HangVerdict | None:
    """The ranks stopped outside any collective while the others wait in one are the culprits.

    This rule comes before the majority rule: it also names a culprit between two ranks, and it
    is not fooled when several ranks are stuck in the same user code while one waits for them.

    Args:
        ordered: frame -> ranks, the largest group first.
        no_dump: the ranks without a usable dump.
        tail: what the summary ends with (those ranks, in words).

    Returns:
        The verdict, or None when every rank waits in a collective or none does.
    """
    waiting = [(f, r) for f, r in ordered if f.waits_for_peers]
    elsewhere = [(f, r) for f, r in ordered if not f.waits_for_peers]
    if not waiting or not elsewhere:
        return None
    culprits = tuple(sorted(r for _, ranks in elsewhere for r in ranks))
    waits = "; ".join(f"{_ranks(r)} stuck at {f}" for f, r in waiting)
    others = "; ".join(f"{_ranks(r)} elsewhere at {f}" for f, r in elsewhere)
    summary = f"hang verdict: {waits}; {others} -> likely culprit: {_ranks(list(culprits))}{tail}"
    frozen = dict(ordered)
    return HangVerdict(frozen, waiting[0][0], culprits, no_dump, summary)
