"""The class of a failed cycle, from its evidence, by a fixed table of rules (no model).

Every rule reads plain evidence (exit codes, the exception type and message of the ``@record``
error file, the hang verdict's frames, the node's OOM-kill counter and health results) and the
first rule that matches decides. The table is :data:`RULES`; docs/launcher.md prints it. Each
verdict names its culprit ranks and nodes and the evidence it rests on, so it can be explained
and tested.

=================  ==================================================================
class              first matching rule (in this order)
=================  ==================================================================
preemption         the cycle ended because a node was preempted (its launcher got the
                   scheduler's SIGTERM and its workers saved an emergency checkpoint); the
                   culprit is that node
gpu_hardware       a failed rank's error names an ECC error, an Xid or a GPU that fell off
                   the bus, or a GPU health check of the node failed
node_health        another health check of the node failed (the node leaves the job)
oom                the kernel's OOM killer killed a process of the node during the cycle
                   and a rank died of SIGKILL; or a rank raised ``OutOfMemoryError`` /
                   ``MemoryError`` ("CUDA out of memory")
config             a rank exited 78 (``EX_CONFIG``), or raised ``ImportError``,
                   ``ModuleNotFoundError``, ``SyntaxError`` or an error whose type name
                   ends in ``ConfigError`` / ``ConfigurationError``
nan_inf            a rank raised ``FloatingPointError``, or its error message names a NaN
                   or Inf loss (``loss is nan``, ``non-finite loss``)
hang_checkpoint    a hang whose culprit frame is in checkpoint code (``checkpoint``,
                   ``torch/serialization.py``), or whose expired section is named like a
                   checkpoint (checkpoint, ckpt, save, load)
hang_io            a hang whose culprit frame is in a data loader (``torch/utils/data``),
                   or outside torch in a function named like a read (read, recv, fetch,
                   shard, loader, dataset, open), or whose expired section is named
                   like data loading (data, loader, batch, io, read, input)
hang_collective    a hang whose culprit is stopped inside ``torch.distributed`` or the
                   autograd engine, or, with no culprit named, every hung rank waits there
hang               any other hang (no stack: stopped, stuck in C code, or gone)
node_lost          a node of the round gave no evidence (its launcher is gone) and every
                   rank that failed elsewhere only lost a peer in a collective
crash              a rank raised an exception (its type is the evidence)
signal             a rank was killed by a signal the launcher did not send
crash              a rank exited with a non-zero code and left no error file
monitor            a rank monitor died (its worker ran on, unwatched: the launcher failed
                   the group)
unknown            no failure of this node's ranks (another node failed)
=================  ==================================================================

The culprits of a crash, a signal or an exit are the failed ranks that failed on their own:

1. a rank the launcher signalled itself (torch's process context stops the surviving ranks with
   SIGTERM once one rank fails; the launcher stops them on a restart) is never a culprit: the
   launcher records which ranks were still running when it signalled them;
2. a rank that failed because a peer went away (a collective's "Connection closed by peer",
   "Connection reset by peer", a gloo read error, a NCCL abort) waited for that peer: it is a
   culprit only when no rank failed otherwise;
3. without the launcher's record (evidence from an older launcher), a rank killed by SIGTERM or
   SIGKILL counts only when no other rank failed on its own.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from resiliency.launcher._failure_records import (
    CycleEvidence,
    FailureClass,
    FailureVerdict,
    RankEvidence,
)

__all__ = [
    "RULES",
    "CycleEvidence",
    "FailureClass",
    "FailureVerdict",
    "RankEvidence",
    "Rule",
    "classify",
]


#: The exit code of a rank that ended on a configuration error (``EX_CONFIG``).
_CONFIG_EXIT = 78
_GPU_RE = re.compile(r"\b(ECC|Xid|fallen off the bus|uncorrectable)\b", re.IGNORECASE)
_OOM_TYPES = ("OutOfMemoryError", "MemoryError")
_OOM_RE = re.compile(r"out of memory", re.IGNORECASE)
_CONFIG_TYPES = ("ImportError", "ModuleNotFoundError", "SyntaxError")
_CONFIG_SUFFIXES = ("ConfigError", "ConfigurationError")
_NAN_RE = re.compile(r"\b(nan|inf|infinity|non-finite|not finite)\b", re.IGNORECASE)
_CHECKPOINT_PLACES = ("checkpoint", "/torch/serialization.py", "ckpt")
_IO_PLACES = ("/torch/utils/data/", "/multiprocessing/queues.py")
_IO_FUNCTIONS = ("read", "recv", "fetch", "shard", "loader", "dataset", "open")
_WAIT_PLACES = ("/torch/distributed/", "/torch/autograd/", "/torch/futures/")
_CHECKPOINT_SECTIONS = ("checkpoint", "ckpt", "save", "load")
_IO_SECTIONS = ("data", "loader", "batch", "io", "read", "input")


#: The culprit ranks and the cause; a rule that blames nodes rather than ranks (a preemption,
#: a lost node, a failed health check) gives them as a third element.
Match = tuple[list[RankEvidence], str] | tuple[list[RankEvidence], str, tuple[int, ...]] | None


@dataclass(frozen=True)
class Rule:
    """One row of the table: a class and the test that picks the culprits and the cause."""

    cls: FailureClass
    name: str
    test: Callable[[CycleEvidence], Match]


def _own_failures(ev: CycleEvidence) -> list[RankEvidence]:
    """The failed ranks that failed on their own (the module docstring's three tiers).

    Ranks the launcher signalled are never returned; with no launcher record at all, every
    failed rank is returned when each one was stopped by a signal.
    """
    failed = [
        r
        for r in ev.ranks.values()
        if not r.hung and r.exitcode not in (None, 0) and r.stopped_by_launcher is not True
    ]
    tiers = (
        lambda r: not r.peer_lost and (r.stopped_by_launcher is False or not r.stopped),
        lambda r: not r.peer_lost,
        lambda r: True,
    )
    for tier in tiers:
        if own := [r for r in failed if tier(r)]:
            return sorted(own, key=_rank)
    return []


def _with_error(ev: CycleEvidence, test: Callable[[RankEvidence], bool]) -> list[RankEvidence]:
    return [r for r in _own_failures(ev) if test(r)]


def _first_error(ranks: list[RankEvidence]) -> Match:
    return (ranks, ranks[0].error() or "") if ranks else None


def _preemption(ev: CycleEvidence) -> Match:
    if not ev.preempted:
        return None
    return ([], ev.preempted, ev.preempted_nodes or (ev.node,))


def _gpu_check(check: str) -> bool:
    return "gpu" in check.lower() or bool(_GPU_RE.search(check))


def _gpu(ev: CycleEvidence) -> Match:
    hit = _with_error(ev, lambda r: bool(_GPU_RE.search(r.error() or "")))
    if hit:
        return _first_error(hit)
    failed = [h for h in ev.health if _gpu_check(h)]
    return ([], failed[0], (ev.node,)) if failed else None


def _node_health(ev: CycleEvidence) -> Match:
    failed = [h for h in ev.health if not _gpu_check(h)]
    return ([], f"node health check failed: {failed[0]}", (ev.node,)) if failed else None


def _node_lost(ev: CycleEvidence) -> Match:
    """Nodes that gave no evidence, when no rank anywhere failed but by losing a peer."""
    if not ev.lost_nodes or any(not r.peer_lost for r in _own_failures(ev)):
        return None
    nodes = ",".join(map(str, ev.lost_nodes))
    return ([], f"node(s) {nodes} gone: no evidence from their launcher", ev.lost_nodes)


def _monitor(ev: CycleEvidence) -> Match:
    if not ev.dead_monitors:
        return None
    ranks = [
        ev.ranks.get(rank) or RankEvidence(rank=rank, node=ev.node) for rank in ev.dead_monitors
    ]
    which = ",".join(map(str, ev.dead_monitors))
    return (ranks, f"the rank monitor of rank(s) {which} died; the group was failed")


def _oom(ev: CycleEvidence) -> Match:
    raised = _with_error(
        ev,
        lambda r: (
            r.exc_type in _OOM_TYPES
            or (r.exc_type or "").endswith(_OOM_TYPES)
            or bool(_OOM_RE.search(r.message or ""))
        ),
    )
    if raised:
        return _first_error(raised)
    killed = [
        r
        for r in ev.ranks.values()
        if r.exitcode == -signal.SIGKILL and not r.hung and r.stopped_by_launcher is not True
    ]
    if ev.oom_kills > 0 and killed:
        return (killed, f"killed by the kernel's OOM killer ({ev.oom_kills} OOM kill(s))")
    return None


def _config(ev: CycleEvidence) -> Match:
    exited = _with_error(ev, lambda r: r.exitcode == _CONFIG_EXIT)
    if exited:
        return (exited, exited[0].error() or f"exit code {_CONFIG_EXIT} (configuration error)")
    return _first_error(
        _with_error(
            ev,
            lambda r: r.exc_type in _CONFIG_TYPES or (r.exc_type or "").endswith(_CONFIG_SUFFIXES),
        )
    )


def _nan(ev: CycleEvidence) -> Match:
    return _first_error(
        _with_error(
            ev,
            lambda r: (
                r.exc_type == "FloatingPointError"
                or ("loss" in (r.message or "").lower() and bool(_NAN_RE.search(r.message or "")))
            ),
        )
    )


def _hang_culprits(ev: CycleEvidence) -> list[RankEvidence]:
    hung = [r for r in ev.ranks.values() if r.hung]
    named = [ev.ranks[r] for r in ev.hang_culprits if r in ev.ranks]
    return sorted(named or hung, key=lambda r: r.rank)


def _section(rank: RankEvidence) -> str:
    timer = rank.timer or ""
    return timer.removeprefix("section:").lower() if timer.startswith("section:") else ""


def _hang_where(
    ev: CycleEvidence,
    places: Sequence[str],
    sections: Sequence[str],
    functions: Sequence[str] = (),
) -> Match:
    """The hang culprits whose frame is in ``places`` (or, outside torch, in a function whose
    name contains one of ``functions``), or whose expired section is named like one of
    ``sections``; the cause is the first one's frame or section."""

    def where(rank: RankEvidence) -> str | None:
        path = (rank.frame_path or "").replace("\\", "/").lower()
        function = (rank.frame or "").split(" (", 1)[0].lower()
        named = any(f in function for f in functions) and "/torch/" not in path
        if rank.frame and (any(p in path for p in places) or named):
            return f"hung at {rank.frame}"
        section = _section(rank)
        if section and any(s in section for s in sections):
            return f"hung in section '{section}'"
        return None

    found = [(rank, text) for rank in _hang_culprits(ev) if (text := where(rank)) is not None]
    return ([rank for rank, _ in found], found[0][1]) if found else None


def _hang_checkpoint(ev: CycleEvidence) -> Match:
    return _hang_where(ev, _CHECKPOINT_PLACES, _CHECKPOINT_SECTIONS)


def _hang_io(ev: CycleEvidence) -> Match:
    return _hang_where(ev, _IO_PLACES, _IO_SECTIONS, _IO_FUNCTIONS)


def _hang_collective(ev: CycleEvidence) -> Match:
    """Culprits stopped inside a collective, or (no culprit named) every hung rank waiting in
    one. A culprit elsewhere, which the others wait for, is not a collective hang."""
    inside = [
        r
        for r in _hang_culprits(ev)
        if r.frame and any(p in (r.frame_path or "").replace("\\", "/") for p in _WAIT_PLACES)
    ]
    return (inside, f"hung at {inside[0].frame}") if inside else None


def _hang(ev: CycleEvidence) -> Match:
    culprits = _hang_culprits(ev)
    if not culprits:
        return None
    first = culprits[0]
    where = f"at {first.frame}" if first.frame else "with no stack dump"
    return (culprits, f"hung {where} ({first.timer or 'timer'} expired)")


def _crash(ev: CycleEvidence) -> Match:
    return _first_error(_with_error(ev, lambda r: r.exc_type is not None))


def _signal(ev: CycleEvidence) -> Match:
    killed = _with_error(ev, lambda r: r.signal_name is not None)
    return (killed, f"killed by {killed[0].signal_name}") if killed else None


def _exit(ev: CycleEvidence) -> Match:
    exited = _with_error(ev, lambda r: r.exitcode is not None and r.exitcode > 0)
    return (exited, f"exited with code {exited[0].exitcode}") if exited else None


#: The table, in the order the rules are tried (see the module docstring).
RULES: tuple[Rule, ...] = (
    Rule(FailureClass.PREEMPTION, "preempted", _preemption),
    Rule(FailureClass.GPU_HARDWARE, "ECC / Xid / GPU health", _gpu),
    Rule(FailureClass.NODE_HEALTH, "node health check", _node_health),
    Rule(FailureClass.OOM, "OOM kill or OOM exception", _oom),
    Rule(FailureClass.CONFIG, "exit 78 or import / config exception", _config),
    Rule(FailureClass.NAN_INF, "NaN or Inf loss", _nan),
    Rule(FailureClass.HANG_CHECKPOINT, "hang in checkpoint code", _hang_checkpoint),
    Rule(FailureClass.HANG_IO, "hang in a data loader or a read", _hang_io),
    Rule(FailureClass.HANG_COLLECTIVE, "hang in a collective", _hang_collective),
    Rule(FailureClass.HANG, "other hang", _hang),
    Rule(FailureClass.NODE_LOST, "node gone", _node_lost),
    Rule(FailureClass.CRASH, "exception", _crash),
    Rule(FailureClass.SIGNAL, "killed by a signal", _signal),
    Rule(FailureClass.CRASH, "non-zero exit", _exit),
    Rule(FailureClass.MONITOR, "rank monitor died", _monitor),
)


def classify(evidence: CycleEvidence) -> FailureVerdict:
    """Apply :data:`RULES` in order; the first that matches gives the verdict.

    Args:
        evidence: the failed cycle's evidence.

    Returns:
        The verdict; class ``unknown`` when no rule matched (no failure of this node's ranks).
    """
    for rule in RULES:
        match = rule.test(evidence)
        if match is None:
            continue
        culprits, cause = match[0], match[1]
        if len(match) == 3:
            nodes = sorted(set(match[2]))
        else:
            nodes = sorted({r.node for r in culprits}) if culprits else [evidence.node]
        return FailureVerdict(
            cls=rule.cls,
            culprit_ranks=tuple(sorted(r.rank for r in culprits)),
            culprit_nodes=tuple(nodes),
            cause=cause,
            rule=rule.name,
            evidence=_evidence(evidence, culprits),
        )
    nothing = "no failure of this node's ranks"
    return FailureVerdict(FailureClass.UNKNOWN, (), (), nothing, "none", _evidence(evidence, []))


def _evidence(ev: CycleEvidence, culprits: list[RankEvidence]) -> dict[str, Any]:
    out: dict[str, Any] = {"node": ev.node, "attempt": ev.attempt}
    out["ranks"] = [r.to_json() for r in (culprits or sorted(ev.ranks.values(), key=_rank))]
    if ev.common_frame:
        out["common_frame"] = ev.common_frame
    if ev.oom_kills:
        out["oom_kills"] = ev.oom_kills
    if ev.health:
        out["health"] = list(ev.health)
    if ev.preempted:
        out["preempted"] = ev.preempted
    if ev.lost_nodes:
        out["lost_nodes"] = list(ev.lost_nodes)
    if ev.dead_monitors:
        out["dead_monitors"] = list(ev.dead_monitors)
    return out


def _rank(r: RankEvidence) -> int:
    return r.rank
