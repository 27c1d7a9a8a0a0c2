"""The in-process goodput job's checkpoints: blocking ``torch.save`` files at the job's cadences.

Every rank saves its (DDP-replicated) model and optimizer to its node's local directory every
``local_every`` steps; rank 0 saves to the persistent directory every ``persistent_every``.
At a fresh start of the group each rank loads the newest file it can read (its node's local
copies, then the persistent ones) inside ``Healer.updating``, so the heal that follows agrees
on the newest step any rank holds and sends it to the ranks that have an older one (a node whose
local directory was wiped). Files are written whole (a temporary file, then a rename); a file
that does not load is skipped with a warning and the next older one is tried.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from pathlib import Path

import torch
from torch import nn

from resiliency import inprocess
from resiliency.goodput import get_recorder

logger = logging.getLogger(__name__)


class PlainCheckpoints:
    """Local (per node) and persistent checkpoint files of one rank.

    Args:
        model: the model whose ``state_dict`` is saved.
        opt: its optimizer.
        local_dir: this node's local directory (wiped when the node is lost).
        persistent_dir: the shared directory.
        local_every: local save cadence, steps.
        persistent_every: persistent save cadence, steps (rank 0 only).
        keep: files kept per directory.
    """

    def __init__(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        local_dir: Path,
        persistent_dir: Path,
        local_every: int,
        persistent_every: int,
        keep: int = 2,
    ) -> None:
        self.model, self.opt = model, opt
        self.dirs = {"local": local_dir, "persistent": persistent_dir}
        self.every = {"local": local_every, "persistent": persistent_every}
        self.keep = keep
        self.load_t0 = time.monotonic()

    def _dir(self, tier: str, rank: int) -> Path:
        return self.dirs[tier] / f"rank{rank}" if tier == "local" else self.dirs[tier]

    def save_due(self, step: int, rank: int) -> bool:
        """Save ``step`` on every tier due at it (blocking; ledger events around each).

        Returns:
            Whether a tier was due at ``step``: the same answer on every rank, also where
            only rank 0 saves (the persistent tier).
        """
        due = False
        for tier, every in self.every.items():
            if step % every == 0:
                due = True
                if tier == "local" or rank == 0:
                    self._save(tier, step, rank)
        return due

    def _save(self, tier: str, step: int, rank: int) -> None:
        rec = get_recorder()
        rec.emit("checkpoint_save_started", step=step, tier=tier)
        t0 = time.monotonic()
        folder = self._dir(tier, rank)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"step_{step:09d}.pt"
        tmp = path.with_suffix(".tmp")
        state = {"step": step, "model": self.model.state_dict(), "opt": self.opt.state_dict()}
        torch.save(state, tmp)
        os.replace(tmp, path)
        took = time.monotonic() - t0
        rec.emit(
            "checkpoint_saved",
            step=step,
            tier=tier,
            bytes=path.stat().st_size,
            blocked_s=took,
            total_s=took,
        )
        for old in sorted(folder.glob("step_*.pt"))[: -self.keep]:
            old.unlink(missing_ok=True)

    def _candidates(self) -> list[tuple[int, str, Path]]:
        found = [
            (int(path.stem.split("_")[1]), tier, path)
            for tier, folder in self.dirs.items()
            for path in folder.glob("**/step_*.pt")
        ]
        return sorted(found, key=lambda c: (c[0], c[1] == "local"), reverse=True)

    def load_newest(self, healer: inprocess.Healer) -> str | None:
        """Load the newest readable file into the model and optimizer, as ``healer``'s step.

        Returns:
            The tier it came from; None when there was none to read.
        """
        self.load_t0 = time.monotonic()
        candidates = self._candidates()
        if not candidates:
            return None
        get_recorder().emit("checkpoint_load_started", tier=candidates[0][1])
        for step, tier, path in candidates:
            try:
                saved = torch.load(path, weights_only=True)
            except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
                logger.warning("checkpoint %s does not load (%s); trying an older one", path, exc)
                continue
            with healer.updating(step):
                self.model.load_state_dict(saved["model"])
                self.opt.load_state_dict(saved["opt"])
            logger.info("loaded step %d from %s", step, path)
            return tier
        return None
