"""The tiered engine: several tiers, each on its own cadence, restore by tier.

``CheckpointManager(root_or_None, tiers=[...])`` (or an object-store root) builds one of these
and forwards every call to it. The persistent tier is a single-root engine: the file-system one
(``_engine.file_system``) or the object-store one (``_remote.engine``); the local tier is a
:class:`~resiliency.checkpoint._tiers.local.LocalSaver`. Each tier has at most one save
in flight; a step due on both tiers is staged for both.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from resiliency.checkpoint._dcp import planning as _dcp
from resiliency.checkpoint._engine.file_system import FileSystemEngine
from resiliency.checkpoint._engine.pipeline import SaveHandle
from resiliency.checkpoint._remote.engine import ObjectStoreEngine
from resiliency.checkpoint._tiers import holdings as _holdings
from resiliency.checkpoint._tiers import restore as _tiered_restore
from resiliency.checkpoint._tiers.local import LocalSave, LocalSaver
from resiliency.checkpoint.errors import CheckpointError, SaveFailedError
from resiliency.checkpoint.tiers import LocalTier, PersistentTier

logger = logging.getLogger(__name__)


class TieredSaveHandle(SaveHandle):
    """The handle of one save on one or more tiers: a ``SaveHandle`` over each tier's save."""

    def __init__(
        self, owner: TieredEngine, step: int, local: LocalSave | None, persistent: Any
    ) -> None:
        # Not SaveHandle.__init__: a tiered save has no single pipeline save to resolve.
        self._owner = owner
        self.step = step
        self._local = local
        self._persistent = persistent
        self.tiers = [n for n, x in (("local", local), ("persistent", persistent)) if x is not None]

    def done(self) -> bool:
        """True once every tier of this save knows its outcome; never blocks."""
        return (self._local is None or self._local.done.is_set()) and (
            self._persistent is None or self._persistent.done()
        )

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the step is committed on its tiers; raise the first (agreed) failure.

        ``timeout`` bounds the whole wait, not each tier's (an emergency save waits with the
        time left before SIGKILL).
        """
        deadline = _deadline(timeout)
        error: BaseException | None = None
        if self._local is not None and self._owner.local is not None:
            if self._owner.local.inflight is self._local:
                try:
                    self._owner.local.wait_previous(timeout)
                except SaveFailedError as exc:
                    error = exc
            elif not self._local.done.wait(timeout):
                raise TimeoutError(f"the local save of step {self.step} is still in flight")
            elif self._local.error is not None:
                error = self._local.error
        if self._persistent is not None:
            self._persistent.wait(_left(deadline))
        if error is not None:
            raise error


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    """What remains of a wait started with ``_deadline`` (None: unbounded)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _split(
    root: str | Path | None, tiers: Sequence[Any]
) -> tuple[LocalTier | None, PersistentTier | None]:
    local = [t for t in tiers if isinstance(t, LocalTier)]
    persistent = [t for t in tiers if isinstance(t, PersistentTier)]
    other = [t for t in tiers if not isinstance(t, LocalTier | PersistentTier)]
    if other or len(local) > 1 or len(persistent) > 1:
        raise ValueError(
            f"tiers takes at most one LocalTier and one PersistentTier, got {list(tiers)!r}"
        )
    if root is not None:
        if persistent:
            raise ValueError("give the persistent directory either as root or as a PersistentTier")
        persistent = [PersistentTier(root, every=1)]
    if not local and not persistent:
        raise ValueError("tiers is empty and no root was given")
    return (local[0] if local else None), (persistent[0] if persistent else None)


class TieredEngine:
    """The multi-tier engine behind ``CheckpointManager(..., tiers=...)``.

    Args:
        root: the persistent directory, when it is not given as a ``PersistentTier``.
        tiers: at most one ``LocalTier`` and one ``PersistentTier``.
        async_save: as for ``CheckpointManager``.
        writer_timeout_s: as for ``CheckpointManager``.
        control_group: the gloo group of the small collectives (None: one process).
    """

    def __init__(
        self,
        root: str | Path | None,
        tiers: Sequence[Any],
        *,
        async_save: bool,
        writer_timeout_s: float,
        control_group: dist.ProcessGroup | None,
    ) -> None:
        self.local_tier, self.persistent_tier = _split(root, tiers)
        self.async_save = async_save
        self.group = control_group
        self.rank = dist.get_rank(control_group) if control_group is not None else 0
        self.world = dist.get_world_size(control_group) if control_group is not None else 1
        self.world_size = self.world
        self.persistent: Any = None
        if self.persistent_tier is not None and self.persistent_tier.is_remote():
            self.persistent = ObjectStoreEngine(
                self.persistent_tier,
                async_save=async_save,
                control_group=control_group,
                writer_timeout_s=writer_timeout_s,
                eager_writer=self.local_tier is None,
            )
        elif self.persistent_tier is not None:
            self.persistent = FileSystemEngine(
                self.persistent_tier.local_path(),
                keep_last=self.persistent_tier.keep_last,
                keep_every=self.persistent_tier.keep_every,
                async_save=async_save,
                control_group=control_group,
                writer_timeout_s=writer_timeout_s,
                # After a restart every rank starts its writers at once, each importing torch;
                # the local tier's saves come first and often, so only its writer starts now.
                eager_writer=self.local_tier is None,
            )
        self.local: LocalSaver | None = None
        if self.local_tier is not None:
            self.local = LocalSaver(self.local_tier, control_group, writer_timeout_s)
        self.root: Any = None  # the persistent tier's directory or URL
        if self.persistent is not None:
            self.root = getattr(self.persistent, "url", self.persistent.root)
        self._closed = False

    def due(self, step: int, tier: str | None) -> tuple[bool, bool]:
        """Which tiers save ``step``: (local, persistent)."""
        if tier is not None and tier not in ("local", "persistent", "all"):
            raise ValueError(f"tier must be 'local', 'persistent', 'all' or None, got {tier!r}")
        local = self.local_tier is not None and (
            tier in ("local", "all") or (tier is None and step % self.local_tier.every == 0)
        )
        persistent = self.persistent_tier is not None and (
            tier in ("persistent", "all")
            or (tier is None and step % self.persistent_tier.every == 0)
        )
        return local, persistent

    def save(self, step: int, state: dict[str, Any], tier: str | None = None) -> TieredSaveHandle:
        if self._closed:
            raise CheckpointError("the CheckpointManager is closed")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        due_local, due_persistent = self.due(step, tier)
        local_save = None
        if due_local:
            assert self.local is not None
            with contextlib.suppress(SaveFailedError):  # logged on every rank
                self.local.wait_previous()
            local_save = self.local.save(step, _dcp.to_state_dict(state))
        persistent_handle = self.persistent.save(step, state) if due_persistent else None
        handle = TieredSaveHandle(self, step, local_save, persistent_handle)
        if not self.async_save:
            handle.wait()
        return handle

    def wait(self, timeout: float | None = None) -> None:
        deadline = _deadline(timeout)  # one bound for both tiers
        error: BaseException | None = None
        if self.local is not None:
            try:
                self.local.wait_previous(timeout)
            except SaveFailedError as exc:
                error = exc
        if self.persistent is not None:
            self.persistent.wait(_left(deadline))
        if error is not None:
            raise error

    def steps(self) -> list[int]:
        """Steps this rank sees committed on any tier (a listing; ``load`` verifies)."""
        found: set[int] = set()
        if self.local is not None:
            found |= {
                s
                for s in _holdings.committed_steps(self.local.root)
                if _holdings.shard_dir(self.local.root, s, self.rank).exists()
            }
        if self.persistent is not None:
            found |= set(self.persistent.steps())
        return sorted(found)

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        if self._closed:
            raise CheckpointError("the CheckpointManager is closed")
        with contextlib.suppress(SaveFailedError):
            self.wait()
        if self.local is not None:
            self.local.ensure_repl_group()
        return _tiered_restore.restore(
            state,
            step,
            rank=self.rank,
            world=self.world,
            group=self.group,
            local=self.local,
            persistent=self.persistent,
        )

    @property
    def writer_pid(self) -> int | None:
        return self.persistent.writer_pid if self.persistent is not None else None

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.local is not None:
                self.local.close(abort)
        finally:
            if self.persistent is not None:
                self.persistent.close(abort)
