"""``resiliency-supervisor status``: the whole job as a table, one row per node."""

from __future__ import annotations

import time

from resiliency.supervisor.backend import Backend
from resiliency.supervisor.document import NodeStatus, keys_for
from resiliency.supervisor.errors import SupervisorError
from resiliency.supervisor.intents import Intent

__all__ = ["STALE_INTERVALS", "job_rows", "render_table"]

#: A row is marked stale once its sample is older than this many of its writer's intervals.
STALE_INTERVALS = 1.5

_COLUMNS = (
    "NODE",
    "STATE",
    "AGE",
    "STEP",
    "RESTARTS",
    "HANGS",
    "RANKS (hb age, section)",
    "STRAGGLER",
    "GPU",
    "CKPT AGE",
    "INTENT",
)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _row(node: str, status: NodeStatus, intent: Intent | None, now: float) -> list[str]:
    age = now - status.time
    stale = age > STALE_INTERVALS * status.interval
    ranks = " ".join(
        f"{r}:{_num(rs.hb_age)}s/{rs.section or '-'}" for r, rs in sorted(status.ranks.items())
    )
    scores = [s for kinds in status.straggler.values() for s in kinds.values()]
    gpu = (
        "n/a"
        if not status.gpu
        else (
            "ok"
            if all(d.ecc_uncorrectable == 0 and not d.xid for d in status.gpu)
            else ",".join(
                f"{d.index}:ecc={d.ecc_uncorrectable},xid={d.xid}"
                for d in status.gpu
                if d.ecc_uncorrectable or d.xid
            )
        )
    )
    return [
        node + (" (STALE)" if stale else ""),
        status.state,
        f"{age:.1f}s",
        _num(status.step, "{}"),
        str(status.restarts),
        ",".join(f"{t}={n}" for t, n in sorted(status.hangs.items())) or "0",
        ranks or "-",
        _num(min(scores) if scores else None, "{:.2f}"),
        gpu,
        _num(status.checkpoint_age),
        f"{intent.action}#{intent.id}" if intent else "-",
    ]


def job_rows(backend: Backend) -> list[list[str]]:
    """Read every node's document and intent; return the table rows (header first)."""
    keys = keys_for(backend.namespace)
    intents = {}
    for key, raw in backend.list(keys.intents).items():
        try:
            intents[key[len(keys.intents) :]] = Intent.from_json(raw)
        except SupervisorError:
            continue
    rows = [list(_COLUMNS)]
    now = time.time()
    for prefix, suffix in ((keys.nodes, ""), (keys.hosts, " [host]")):
        for key, raw in sorted(backend.list(prefix).items()):
            node = key[len(prefix) :]
            try:
                status = NodeStatus.from_json(raw)
            except SupervisorError as exc:
                rows.append([node + suffix, f"invalid: {exc}"] + [""] * (len(_COLUMNS) - 2))
                continue
            rows.append(_row(node + suffix, status, intents.get(node), now))
    return rows


def render_table(rows: list[list[str]]) -> str:
    """Align the rows into columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
