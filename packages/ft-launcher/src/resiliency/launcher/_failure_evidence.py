"""Gathering a failed cycle's evidence on one node: exits, error files, hangs, OOM kills.

Plain reading, no judgement (that is :mod:`resiliency.launcher.failure_classes`): torch's
``ProcessFailure`` of each failed worker (exit code, and the exception of its ``@record`` error
file), the hang verdict (each rank's innermost frame, job-wide when several nodes took part), and
the kernel's count of OOM kills in the launcher's cgroup (``memory.events``, cgroup v2), read when
the workers start and when they stop.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Collection, Mapping
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.ft import MonitorEvent
from resiliency.launcher.failure_classes import CycleEvidence, RankEvidence
from resiliency.launcher.verdict import HangVerdict

__all__ = [
    "cycle_evidence",
    "error_text",
    "oom_kill_count",
    "parse_error_message",
    "signal_name",
]

logger = logging.getLogger(__name__)

# torch's @record writes "<type name>: <message>" (the message may span lines).
_ERROR_RE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s*(?P<message>.*))?$", re.DOTALL)
_MAX_MESSAGE = 500
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11; the number itself for an unknown signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def parse_error_message(text: str | None) -> tuple[str | None, str | None]:
    """Split an ``@record`` error message into the exception type and its message.

    Returns:
        (type, message); (None, None) when the text is not ``Type: message``.
    """
    if not text:
        return None, None
    match = _ERROR_RE.match(text.strip())
    if match is None:
        return None, None
    message = (match.group("message") or "").strip()
    # Only the first line: the same error repeats with the same first line, and it stays short.
    first = message.splitlines()[0] if message else ""
    return match.group("type").rsplit(".", 1)[-1], first[:_MAX_MESSAGE] or None


def oom_kill_count(cgroup_root: Path = _CGROUP_ROOT) -> int | None:
    """The ``oom_kill`` counter of this process's cgroup (v2), or None where it cannot be read.

    The counter covers the cgroup and its descendants, so workers started by the launcher (in its
    cgroup, or a child of it) are counted.
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        path = next(line.split("::", 1)[1] for line in lines if line.startswith("0::"))
        events = (cgroup_root / path.lstrip("/") / "memory.events").read_text()
    except (OSError, StopIteration, IndexError):
        return None
    for line in events.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def error_text(failure: ProcessFailure) -> str | None:
    """The exception a worker's ``@record`` error file holds (``Type: message``), or None.

    torch keeps the error file's ``message`` as written: a string, or (torch's own format) an
    object whose ``message`` is the string and whose ``extraInfo`` holds the traceback.
    """
    if not failure.error_file or not os.path.isfile(failure.error_file):
        return None
    message: object = failure.message
    if isinstance(message, dict):
        message = message.get("message")
    return message if isinstance(message, str) and message else None


def _from_failure(
    rank: int, node: int, failure: ProcessFailure, signalled: Collection[int] | None
) -> RankEvidence:
    exc_type, message = parse_error_message(error_text(failure))
    return RankEvidence(
        rank=rank,
        node=node,
        exitcode=failure.exitcode,
        exc_type=exc_type,
        message=message,
        stopped_by_launcher=None if signalled is None else rank in signalled,
    )


def cycle_evidence(
    *,
    node: int,
    attempt: int,
    failures: Mapping[int, ProcessFailure],
    hangs: Mapping[int, MonitorEvent],
    verdict: HangVerdict | None,
    oom_kills: int = 0,
    health: tuple[str, ...] = (),
    preempted: str | None = None,
    signalled: Collection[int] | None = None,
    dead_monitors: tuple[int, ...] = (),
) -> CycleEvidence:
    """The evidence of one failed cycle, as this node knows it.

    Args:
        node: this node's group rank.
        attempt: the cycle's restart count.
        failures: torch's failures of this node's workers, by global rank.
        hangs: this node's monitors' hang reports, by local rank.
        verdict: the cycle's hang verdict (job-wide when there is one), None without a hang.
        oom_kills: OOM kills in this node's cgroup during the cycle.
        health: failed health checks (``name: detail``).
        preempted: why the cycle counts as a preemption, if it does.
        signalled: global ranks the launcher itself signalled while they ran; None when it
            kept no record.
        dead_monitors: global ranks whose rank monitor died during the cycle.
    """
    ranks = {rank: _from_failure(rank, node, f, signalled) for rank, f in failures.items()}
    timers = {ev.rank: ev.timer for ev in hangs.values() if ev.rank is not None}
    common = None
    if verdict is not None:
        nodes = dict(verdict.nodes)
        for frame, group in verdict.by_frame.items():
            for rank in group:
                ranks[rank] = RankEvidence(
                    rank=rank,
                    node=nodes.get(rank, node),
                    frame=str(frame),
                    frame_path=frame.filename,
                    timer=timers.get(rank),
                    hung=True,
                )
        for rank in verdict.no_dump:
            ranks[rank] = RankEvidence(
                rank=rank, node=nodes.get(rank, node), timer=timers.get(rank), hung=True
            )
        common = verdict.common_frame
    for rank, timer in timers.items():
        if rank not in ranks or not ranks[rank].hung:
            ranks[rank] = RankEvidence(rank=rank, node=node, timer=timer, hung=True)
    return CycleEvidence(
        node=node,
        attempt=attempt,
        ranks=ranks,
        hang_culprits=tuple(verdict.culprits) if verdict is not None else (),
        common_frame=str(common) if common is not None else None,
        oom_kills=oom_kills,
        health=health,
        preempted=preempted,
        dead_monitors=dead_monitors,
    )
