"""Fault injection into healing, for tests: the one home of ``HEAL_FAULT_ENV``.

``RESILIENCY_INPROCESS_HEAL_FAULT`` is a comma-separated list of ``ACTION@RANK`` entries; each
fires once per process, the first time that rank (its rank in the healing group) sends its
state to a peer:

- ``corrupt@R``: rank R flips one byte of what it sends, after its checksum was taken (a
  transfer corrupted on the way: the receiver must detect it and try another peer);
- ``raise@R``: rank R raises ``RuntimeError`` instead of sending its state (a
  fault during healing: the job must resume at one agreed step, never at mixed ones).

Unset in production: reading it costs one environment lookup per send.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)

HEAL_FAULT_ENV = "RESILIENCY_INPROCESS_HEAL_FAULT"
_ACTIONS = ("corrupt", "raise")
_fired: set[str] = set()


def _due(action: str, rank: int) -> bool:
    entry = f"{action}@{rank}"
    spec = os.environ.get(HEAL_FAULT_ENV, "")
    entries = {e.strip() for e in spec.split(",") if e.strip()}
    for bad in sorted(e for e in entries if e.partition("@")[0] not in _ACTIONS):
        log.warning("%s: ignoring %r (expected corrupt@RANK or raise@RANK)", HEAL_FAULT_ENV, bad)
    if entry not in entries or entry in _fired:
        return False
    _fired.add(entry)
    return True


def maybe_corrupt(buffer: torch.Tensor, rank: int) -> torch.Tensor:
    """``buffer``, or a copy with one byte flipped when ``corrupt@rank`` is due."""
    if not _due("corrupt", rank):
        return buffer
    bad = buffer.clone()
    middle = bad.numel() // 2
    bad[middle] ^= 0xFF
    log.warning("rank %d: %s: flipped byte %d of the state it sends", rank, HEAL_FAULT_ENV, middle)
    return bad


def maybe_raise(rank: int) -> None:
    """Raise when ``raise@rank`` is due."""
    if _due("raise", rank):
        raise RuntimeError(
            f"{HEAL_FAULT_ENV}: injected fault on rank {rank} while sending its state"
        )
