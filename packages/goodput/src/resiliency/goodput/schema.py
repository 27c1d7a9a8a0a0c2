"""The goodput event schema: versioned event types and their fields, validated by hand.

Every ledger line is one JSON object with the common fields (`COMMON_FIELDS`) and the fields
of its event type (`EVENT_TYPES`). Validation is plain Python (no pydantic): a reader checks
hundreds of thousands of lines per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
"""Version of the ledger schema this package writes and reads (an integer, bumped on change)."""

TIERS = ("persistent", "local", "replica")
CYCLE_CAUSES = ("success", "crash", "hang", "workload_control", "preemption", "signal")
#: The launcher's failure classes (resiliency.launcher.failure_classes; a reader accepts others).
FAILURE_CLASSES = (
    "crash",
    "oom",
    "signal",
    "nan_inf",
    "hang_collective",
    "hang_io",
    "hang_checkpoint",
    "hang",
    "gpu_hardware",
    "preemption",
    "config",
    "node_health",
    "node_lost",
    "monitor",
)
DECISIONS = ("restart", "restart_without_node", "stop")
#: What started an in-process restart (resiliency.inprocess; a reader accepts others).
INPROCESS_CAUSES = ("exception", "hang", "peer_fault")


@dataclass(frozen=True)
class Field:
    """One field of an event: its kind, whether it must be present, and what it means."""

    kind: str
    required: bool
    doc: str


def _f(kind: str, doc: str, required: bool = True) -> Field:
    return Field(kind, required, doc)


COMMON_FIELDS: dict[str, Field] = {
    "schema": _f("int", "schema version of the line (`SCHEMA_VERSION` of the writer)"),
    "job": _f("str", "job id (`RESILIENCY_JOB_ID`, else `TORCHELASTIC_RUN_ID`, else `default`)"),
    "event": _f("str", "event type, one of the types below"),
    "time": _f("str", "wall time, ISO 8601 in UTC (`2026-11-23T01:02:03.456789+00:00`)"),
    "mono": _f("float", "monotonic clock of the writing process, seconds"),
    "node": _f("str", "node: `GROUP_RANK`, else the host name"),
    "rank": _f("int?", "global rank of the writer (`RANK`); null for the launcher"),
    "attempt": _f("int", "restart count (`TORCHELASTIC_RESTART_COUNT`, 0 when absent)"),
}

EVENT_TYPES: dict[str, dict[str, Field]] = {
    "job_scheduled": {},
    "job_started": {},
    "job_ended": {
        "exit_code": _f("int", "exit code of the launcher"),
        "reason": _f("str", "why the job ended (success, failure, preemption, signal...)"),
    },
    "cycle_started": {"cycle": _f("int", "cycle number: 0 for the first run of the workers")},
    "cycle_ended": {
        "cycle": _f("int", "cycle number"),
        "cause": _f("cause", "one of " + ", ".join(CYCLE_CAUSES)),
        "timer": _f("str?", "the timer that expired for a hang (heartbeat, section name)", False),
        "ranks": _f("list[int]", "the ranks that failed or hung", False),
    },
    "hang_detected": {
        "rank": _f("int", "the hung rank"),
        "timer": _f("str", "the timer that expired"),
        "latency_s": _f("float", "detection latency: seconds past the timer's limit"),
        "timeout_s": _f(
            "float?", "the timer's limit, seconds (dates the start of the hang)", False
        ),
    },
    "step": {"step": _f("int", "the training step just finished (sampled, rank 0 only)")},
    "checkpoint_save_started": {
        "step": _f("int", "step being saved"),
        "tier": _f("tier", "one of " + ", ".join(TIERS)),
    },
    "checkpoint_saved": {
        "step": _f("int", "step saved"),
        "tier": _f("tier", "one of " + ", ".join(TIERS)),
        "bytes": _f("int", "bytes written"),
        "blocked_s": _f("float", "seconds the training loop was blocked by the save"),
        "total_s": _f("float", "seconds from the start of the save to its commit"),
    },
    "checkpoint_save_failed": {
        "step": _f("int", "step whose save failed"),
        "tier": _f("tier", "one of " + ", ".join(TIERS)),
        "error": _f("str", "the error"),
    },
    "checkpoint_load_started": {"tier": _f("tier", "one of " + ", ".join(TIERS))},
    "checkpoint_loaded": {
        "step": _f("int", "step restored"),
        "tier": _f("tier", "one of " + ", ".join(TIERS)),
        "bytes": _f("int", "bytes read"),
        "duration_s": _f("float", "seconds the load took (it ends at the event's time)"),
    },
    "straggler_detected": {
        "ranks": _f("list[int]", "the straggling ranks"),
        "scores": _f("dict", "their scores"),
    },
    "fault_injected": {
        "kind": _f("str", "kind of fault (simulator)"),
        "victim": _f("str", "what was hit"),
    },
    "preempted": {"step": _f("int", "step of the emergency checkpoint")},
    "supervisor_decision": {
        "target": _f("str", "the node acted on (the event's own `node` is the controller's)"),
        "action": _f("str", "exclude, restart or shutdown"),
        "policy": _f("str", "the deciding policy (straggler, gpu_health, ...)"),
        "reason": _f("str", "one line saying why"),
        "evidence": _f("dict", "the samples the decision rests on"),
    },
    "diagnosis": {
        "cls": _f("str", "failure class: " + ", ".join(FAILURE_CLASSES)),
        "culprit_ranks": _f("list[int]", "global ranks to blame"),
        "culprit_nodes": _f("list[str]", "their nodes, as in `node` (`GROUP_RANK`)"),
        "decision": _f("str", "one of " + ", ".join(DECISIONS)),
        "evidence": _f("dict", "what the verdict rests on (exit codes, error, frames, ...)"),
        "rule": _f("str", "the stop rule that decided (repeated, restart_storm, ...)", False),
        "cycle": _f("int", "the launcher's cycle number of the failed cycle", False),
    },
    "inprocess_restart": {
        "cause": _f("str", "what started it: " + ", ".join(INPROCESS_CAUSES)),
        "reason": _f("str", "exception type and message, or what hung or went silent"),
        "ranks": _f("list[int]", "global ranks where the fault happened"),
        "lost_ranks": _f("list[int]", "global ranks that left the job in it", False),
        "iteration": _f("int", "the wrapper's restart iteration the job resumed as (1 = first)"),
        "duration_s": _f("float", "seconds from the fault to the new call (it ends at the event)"),
        "phases": _f("dict", "seconds per phase: abort, health_check, barrier, release", False),
        "timeout_s": _f(
            "float", "a hang's soft timeout: it began this long before the fault", False
        ),
    },
    "inprocess_heal": {
        "step": _f("int", "the step every rank resumed from (the newest one some rank held whole)"),
        "lost_steps": _f("int", "steps a rank had committed before the fault that none kept"),
        "healed_ranks": _f("list[int]", "ranks whose state was replaced by a peer's copy"),
        "source_ranks": _f("list[int]", "ranks that held the agreed step and sent it"),
        "bytes": _f("int", "bytes of state each healed rank received"),
        "failed_copies": _f("int", "copies that failed verification and were fetched again"),
        "duration_s": _f(
            "float", "seconds of the heal on the recording rank (it ends at the event)"
        ),
        "iteration": _f("int", "the in-process wrapper's iteration it ran in", False),
    },
    "inprocess_rollback": {
        "step": _f("int", "the step every rank reloaded and resumed from (e.g. a local-tier save)"),
        "lost_steps": _f("int", "steps some rank had trained before the fault that are done again"),
        "trained_steps": _f(
            "list[int]", "per rank, the newest step it had trained before the fault (-1: none)"
        ),
        "iteration": _f("int", "the in-process wrapper's iteration it ran in", False),
    },
}

EVENT_DOCS: dict[str, str] = {
    "job_scheduled": "the job was submitted (queue time counts as start-up)",
    "job_started": "the launcher started",
    "job_ended": "the launcher is exiting",
    "cycle_started": "the launcher started (or restarted) the workers",
    "cycle_ended": "the workers of a cycle stopped",
    "hang_detected": "a rank monitor found a hung rank",
    "step": "a training step finished",
    "checkpoint_save_started": "a checkpoint save began",
    "checkpoint_saved": "a checkpoint save was committed",
    "checkpoint_save_failed": "a checkpoint save failed",
    "checkpoint_load_started": "a checkpoint load began",
    "checkpoint_loaded": "a checkpoint was restored",
    "straggler_detected": "the straggler detector reported slow ranks",
    "fault_injected": "the simulator injected a fault",
    "preempted": "an emergency checkpoint was saved on preemption",
    "supervisor_decision": "the supervisor's controller decided an action on a node",
    "diagnosis": "the launcher's verdict on a failed cycle: class, culprits, decision",
    "inprocess_restart": "the in-process wrapper restarted the function in the same processes",
    "inprocess_heal": "after an in-process restart the ranks agreed on one step and healed the "
    "ranks that lacked it from a peer's memory",
    "inprocess_rollback": "after an in-process restart every rank reloaded one agreed step "
    "(sharded state, e.g. FSDP, from the checkpoint's local tier)",
}


def _check(kind: str, value: Any) -> bool:  # noqa: PLR0911 -- one return per kind reads best
    if kind in ("int", "int?"):
        if value is None:
            return kind == "int?"
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float", "float?"):
        if value is None:
            return kind == "float?"
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("str", "str?"):
        return isinstance(value, str) or (value is None and kind == "str?")
    if kind == "tier":
        return value in TIERS
    if kind == "cause":
        return value in CYCLE_CAUSES
    if kind == "list[int]":
        return isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        )
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "dict":
        return isinstance(value, dict)
    raise AssertionError(f"unknown field kind {kind!r}")  # pragma: no cover


def validate_fields(event: str, fields: dict[str, Any]) -> str | None:
    """Check the type-specific fields of ``event``; return the problem, or None when valid."""
    spec = EVENT_TYPES.get(event)
    if spec is None:
        return f"unknown event type {event!r}"
    for name, field in spec.items():
        if name not in fields:
            if field.required:
                return f"{event}: missing field {name!r}"
            continue
        if not _check(field.kind, fields[name]):
            return f"{event}: field {name!r} must be {field.kind}, got {fields[name]!r}"
    return None


def validate_event(obj: Any) -> str | None:
    """Check one whole ledger line (common and type fields); return the problem or None.

    Unknown extra fields are allowed (a newer writer of the same schema version may add
    optional ones); a missing or mistyped field is a problem.
    """
    if not isinstance(obj, dict):
        return "not a JSON object"
    for name, field in COMMON_FIELDS.items():
        if name not in obj:
            return f"missing field {name!r}"
        if not _check(field.kind, obj[name]):
            return f"field {name!r} must be {field.kind}, got {obj[name]!r}"
    return validate_fields(obj["event"], obj)


def render_schema_reference() -> str:
    """The schema reference of docs/goodput.md, generated from the definitions above."""
    lines = [
        f"Schema version: **{SCHEMA_VERSION}**. Every line holds the common fields:",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{n}` | {f.kind} | {f.doc} |" for n, f in COMMON_FIELDS.items()]
    lines += ["", "Event types and their own fields (optional ones in *italics*):", ""]
    lines += ["| event | when | fields |", "|---|---|---|"]
    for event, spec in EVENT_TYPES.items():
        parts = []
        for name, field in spec.items():
            text = f"`{name}`: {field.kind}, {field.doc}"
            parts.append(text if field.required else f"*{text}*")
        lines.append(f"| `{event}` | {EVENT_DOCS[event]} | {'<br>'.join(parts) or '-'} |")
    return "\n".join(lines) + "\n"


REFERENCE_BEGIN = (
    "<!-- schema reference: generated by `python -m resiliency.goodput._reference`; do not edit -->"
)
REFERENCE_END = "<!-- end of the schema reference -->"


def update_schema_reference(text: str) -> str:
    """``text`` (docs/goodput.md) with its schema reference section regenerated."""
    begin, end = text.find(REFERENCE_BEGIN), text.find(REFERENCE_END)
    if begin < 0 or end < begin:
        raise ValueError("the page has no schema reference markers")
    head = text[: begin + len(REFERENCE_BEGIN)]
    return f"{head}\n\n{render_schema_reference()}\n{text[end:]}"
