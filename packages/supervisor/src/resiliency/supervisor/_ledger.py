"""Follow this host's goodput ledger for what the workers report (steps, checkpoints,
straggler scores), without any new channel between the workers and the launcher."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["LedgerTail"]

logger = logging.getLogger(__name__)

_MAX_READ = 4 * 1024 * 1024


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
    """

    def __init__(self, directory: str | os.PathLike[str], host: str | None = None) -> None:
        self.directory = Path(directory)
        host = host or socket.gethostname()
        self._suffix = "." + (re.sub(r"[^A-Za-z0-9_.-]", "_", host) or "_") + ".jsonl"
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.step: int | None = None
        self.checkpoint_time: float | None = None
        self.straggler_seq = 0
        self.straggler: dict[int, dict[str, float]] = {}
        self.poll(set(), skip_existing=True)

    def poll(self, ranks: set[int], *, skip_existing: bool = False) -> None:
        """Read new complete lines; keep those written by ``ranks`` (this node's workers)."""
        try:
            files = [p for p in self.directory.iterdir() if p.name.endswith(self._suffix)]
        except OSError:
            return
        for path in files:
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
                self._line(line, ranks)

    def _line(self, line: bytes, ranks: set[int]) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict) or event.get("rank") not in ranks:
            return
        kind = event.get("event")
        if kind == "step" and isinstance(event.get("step"), int):
            self.step = event["step"]
        elif kind == "checkpoint_saved":
            self.checkpoint_time = _wall(event.get("time"))
            if isinstance(event.get("step"), int):
                self.step = max(self.step or 0, event["step"])
        elif kind == "straggler_detected":
            self.straggler_seq += 1
            self.straggler = _scores(event.get("scores"))

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
