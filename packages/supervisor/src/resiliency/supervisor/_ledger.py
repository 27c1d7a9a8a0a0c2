"""Follow this host's goodput ledger for what the workers report (steps, checkpoints,
straggler scores) and what the launcher concluded (its ``diagnosis`` of each failed cycle),
without any new channel between the workers, the launcher and the sensor."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

from resiliency.goodput import host_ledger_files

__all__ = ["LedgerTail"]

logger = logging.getLogger(__name__)

_MAX_READ = 4 * 1024 * 1024
#: The latest diagnoses a node's document carries (a controller cycle reads them all).
MAX_DIAGNOSES = 4


def _scores(raw: Any) -> dict[int, dict[str, float]]:
    """``{rank: score}`` or ``{rank: {kind: score}}`` -> ``{rank: {kind: score}}``."""
    out: dict[int, dict[str, float]] = {}
    if not isinstance(raw, dict):
        return out
    for rank, value in raw.items():
        try:
            if isinstance(value, dict):
                out[int(rank)] = {str(k): float(v) for k, v in value.items()}
            else:
                out[int(rank)] = {"score": float(value)}
        except (TypeError, ValueError):
            continue
    return out


class LedgerTail:
    """Reads the new lines of this host's ledger files in a goodput directory.

    Args:
        directory: the goodput ledger directory (``RESILIENCY_GOODPUT_DIR``).
        host: the host whose files are read (default: this machine).

    Attributes:
        step: the last ``step`` event's step.
        checkpoint_time: wall time of the last ``checkpoint_saved``.
        straggler_seq: ``straggler_detected`` events seen.
        straggler: the latest report's scores, rank -> {kind: score}.
        diagnoses: the launcher's latest verdicts on failed cycles, oldest first, each
            ``{"seq", "cycle", "cls", "culprit_ranks", "culprit_nodes", "decision", "rule",
            "cause"}``; ``seq`` counts the verdicts this tail has read (1, 2, ...).
    """

    def __init__(self, directory: str | os.PathLike[str], host: str | None = None) -> None:
        self.directory = Path(directory)
        self.host = host or socket.gethostname()
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.step: int | None = None
        self.checkpoint_time: float | None = None
        self.straggler_seq = 0
        self.straggler: dict[int, dict[str, float]] = {}
        self._diagnoses: deque[dict[str, Any]] = deque(maxlen=MAX_DIAGNOSES)
        self._diagnosis_seq = 0
        self.poll(set(), skip_existing=True)

    @property
    def diagnoses(self) -> list[dict[str, Any]]:
        """The latest verdicts of this node's launcher, oldest first."""
        return list(self._diagnoses)

    def poll(
        self, ranks: set[int], *, node: str | None = None, skip_existing: bool = False
    ) -> None:
        """Read new complete lines; keep those written by ``ranks`` (this node's workers) and
        the ``diagnosis`` events of this node's launcher.

        Args:
            ranks: this node's workers' global ranks.
            node: this node's name in the ledger (its group rank in its latest round, as its
                launcher writes it); None: no diagnosis is kept (several launchers can share a
                host's ledger file, each writes under its own group rank).
            skip_existing: start at the files' current ends.
        """
        for path in host_ledger_files(self.directory, self.host):
            try:
                size = path.stat().st_size
                if skip_existing or path not in self._offsets:
                    self._offsets.setdefault(path, size if skip_existing else 0)
                offset = self._offsets[path]
                if size <= offset:
                    continue
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(min(size - offset, _MAX_READ))
            except OSError as exc:
                logger.debug("cannot read %s: %s", path, exc)
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.pop(path, b"") + data
            lines = data.split(b"\n")
            if lines[-1]:
                self._partial[path] = lines[-1]
            for line in lines[:-1]:
                self._line(line, ranks, node)

    def _line(self, line: bytes, ranks: set[int], node: str | None) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("event")
        if kind == "diagnosis":
            if node is not None and event.get("rank") is None and event.get("node") == node:
                self._diagnosis(event)
            return
        if event.get("rank") not in ranks:
            return
        if kind == "step" and isinstance(event.get("step"), int):
            self.step = event["step"]
        elif kind == "checkpoint_saved":
            self.checkpoint_time = _wall(event.get("time"))
            if isinstance(event.get("step"), int):
                self.step = max(self.step or 0, event["step"])
        elif kind == "straggler_detected":
            self.straggler_seq += 1
            self.straggler = _scores(event.get("scores"))

    def _diagnosis(self, event: dict[str, Any]) -> None:
        evidence = event.get("evidence")
        cause = evidence.get("cause") if isinstance(evidence, dict) else None
        try:
            verdict = {
                "cycle": event.get("cycle"),
                "cls": str(event["cls"]),
                "culprit_ranks": [int(r) for r in event.get("culprit_ranks") or []],
                "culprit_nodes": [str(n) for n in event.get("culprit_nodes") or []],
                "decision": str(event["decision"]),
                "rule": event.get("rule"),
                # One line: the document stays small (the evidence stays in the ledger).
                "cause": str(cause)[:300] if cause is not None else None,
            }
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("ignoring a malformed diagnosis event in the ledger: %s", exc)
            return
        self._diagnosis_seq += 1
        self._diagnoses.append({"seq": self._diagnosis_seq, **verdict})

    def checkpoint_age(self) -> float | None:
        """Seconds since the last committed checkpoint (None: none seen)."""
        if self.checkpoint_time is None:
            return None
        return max(0.0, time.time() - self.checkpoint_time)


def _wall(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None
