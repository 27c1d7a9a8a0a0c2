"""``CheckpointManager``: asynchronous, atomic, verified DCP checkpoints under one root.

``save``, ``wait``, ``load`` and ``close`` are collective: every rank of the group calls them in
the same order (as with ``dcp.save``). ``latest``, ``steps`` and ``SaveHandle.done`` are local.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from resiliency.checkpoint import _events
from resiliency.checkpoint._collectives import agree as _agree
from resiliency.checkpoint._engine import dcp as _dcp
from resiliency.checkpoint._engine import layout as _layout
from resiliency.checkpoint._engine import restore as _restore
from resiliency.checkpoint._engine import root_check as _root_check
from resiliency.checkpoint._engine import staging as _staging
from resiliency.checkpoint._engine.commit import IO_FAILED, OK, WRITER_FAILED, Save, complete
from resiliency.checkpoint._writer.client import WriterDiedError, WriterHungError, WriterProcess
from resiliency.checkpoint.errors import CheckpointError, SaveFailedError, WriterFailedError
from resiliency.checkpoint.tiers import PersistentTier, _is_url

__all__ = ["CheckpointManager", "SaveHandle"]

logger = logging.getLogger(__name__)


class SaveHandle:
    """The handle of one save: ``done()`` is local, ``wait()`` is collective."""

    def __init__(self, manager: CheckpointManager, save: Save | None, step: int) -> None:
        self._manager = manager
        self._save = save
        self.step = step

    def done(self) -> bool:
        """True once this rank knows the outcome (committed or failed); never blocks."""
        return self._save is None or self._save.done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the step is committed everywhere; raise the agreed failure on every rank.

        Raises:
            SaveFailedError: the save failed on some rank (e.g. disk full).
            WriterFailedError: a writer process died or hung on some rank.
            TimeoutError: ``timeout`` passed first; the save stays in flight (wait again).
        """
        if self._save is not None:
            self._manager._resolve(self._save, timeout)


def _control_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The gloo group the manager's small CPU collectives run on (None: one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = group or dist.group.WORLD
    assert pg is not None
    if "gloo" in str(dist.get_backend(pg)):
        return pg
    return dist.new_group(dist.get_process_group_ranks(pg), backend="gloo")


class CheckpointManager:
    """Save and restore training state as standard DCP checkpoints under ``root``.

    Args:
        root: directory holding ``step_<N:09d>/`` checkpoints (shared by all ranks), or an
            object-store URL such as ``s3://bucket/ckpt`` (fsspec; see docs/checkpoint_tiers.md,
            "Object stores").
        keep_last: keep the newest N committed steps (None: keep all).
        keep_every: also keep forever every step divisible by this number.
        async_save: when False, ``save`` returns only once the step is committed.
        process_group: the ranks that save together (default: the whole job).
        writer_timeout_s: bound on one save's writing; a writer silent for longer is killed
            and the save fails on every rank with ``WriterFailedError``.
        eager_writer: start the writer process now, so its imports overlap the job's start-up
            (default); False starts it at the first save. With ``tiers``, the persistent
            tier's writer starts at its first save when a local tier saves first.
        tier: the goodput tier name of this manager's saves.
        tiers: save on several tiers, each on its own cadence, e.g.
            ``[LocalTier("/dev/shm/ckpt", every=10), PersistentTier("/shared/ckpt", every=500)]``
            (``root`` is then None; see :mod:`resiliency.checkpoint.tiers`). ``load`` restores
            the newest step every rank can assemble, nearest tier first.
    """

    _accepts_urls = False  # True in the object-store subclass, which this one builds for URLs
    _sync_files = True  # the writer fsyncs what it writes (the files are the checkpoint)

    def __init__(
        self,
        root: str | Path | None,
        *,
        keep_last: int | None = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        process_group: dist.ProcessGroup | None = None,
        writer_timeout_s: float = 600.0,
        tier: str = "persistent",
        tiers: Sequence[Any] | None = None,
        eager_writer: bool = True,
    ) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        if keep_every is not None and keep_every < 1:
            raise ValueError(f"keep_every must be >= 1 or None, got {keep_every}")
        if writer_timeout_s <= 0:
            raise ValueError(f"writer_timeout_s must be > 0, got {writer_timeout_s}")
        self._tiered: Any = None
        if tiers is not None:
            self._init_tiers(root, tiers, async_save, process_group, writer_timeout_s)
            return
        if root is None:
            raise ValueError("root is required unless tiers are given")
        if not self._accepts_urls and _is_url(root) and PersistentTier(root).is_remote():
            # An object store commits differently (see _remote_manager); it is the tiered
            # engine's persistent tier, with no local tier.
            store = PersistentTier(root, keep_last=keep_last, keep_every=keep_every)
            self._init_tiers(None, [store], async_save, process_group, writer_timeout_s)
            return
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.async_save = async_save
        self.writer_timeout_s = float(writer_timeout_s)
        self.tier = tier
        self._group = _control_group(process_group)
        self.rank = dist.get_rank(self._group) if self._group is not None else 0
        self.world_size = dist.get_world_size(self._group) if self._group is not None else 1
        self.root = self._open_root(root)
        self._arena = _staging.Arena()
        self._writer: WriterProcess | None = WriterProcess() if eager_writer else None
        self._inflight: Save | None = None
        self._plan_cache = _dcp.PlanCache()
        self._staging_key: tuple[int, int] | None = None
        self._staging_views: list[Any] = []
        self._staging_json: list[dict[str, Any]] = []
        self._staged_for: _dcp.Plan | None = None
        self._staged_items: list[Any] = []
        self._staged_slots: list[_staging.Slot] = []
        self._staging_end = 0
        self._closed = False
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _shutdown, self._writer, self._arena)

    def _open_root(self, root: str | Path) -> Path:
        """Make the root ready (collective); return the directory the writer writes under."""
        path = PersistentTier(root).local_path().resolve()
        _root_check.ensure_writable(path, self.rank)  # not at the first save: see _root_check
        if self.rank == 0:
            _layout.remove_stale(path)
        return path

    def _init_tiers(
        self, root: Any, tiers: Sequence[Any], async_save: bool, group: Any, timeout: float
    ) -> None:
        from resiliency.checkpoint._tiers.engine import TieredCheckpoints  # noqa: PLC0415 -- it builds managers itself

        self._group = _control_group(group)
        self._tiered = TieredCheckpoints(
            root,
            tiers,
            async_save=async_save,
            process_group=group,
            writer_timeout_s=timeout,
            control_group=self._group,
        )
        self.root = self._tiered.root
        self.async_save, self.writer_timeout_s = async_save, float(timeout)
        self.rank, self.world_size = self._tiered.rank, self._tiered.world
        self._closed, self._inflight, self._writer = False, None, None

    # ------------------------------------------------------------------ queries (local)
    def steps(self) -> list[int]:
        """Committed steps under the root, ascending (a listing; ``load`` verifies)."""
        if self._tiered is not None:
            return list(self._tiered.steps())
        return _layout.committed_steps(self.root)

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    @property
    def writer_pid(self) -> int | None:
        """The pid of this rank's writer process (None after ``close``)."""
        if self._tiered is not None:
            return self._tiered.writer_pid
        return self._writer.pid if self._writer is not None else None

    # ------------------------------------------------------------------ save
    @property
    def tiered(self) -> bool:
        """Whether this manager saves on tiers (then ``save(..., tier=...)`` is available)."""
        return self._tiered is not None

    def save(self, step: int, state: dict[str, Any], *, tier: str | None = None) -> SaveHandle:
        """Save ``state`` as ``step``; returns once the state is staged (collective).

        Blocks training only for DCP's planning and the copy into the staging arena. A previous
        save still in flight is waited for first; its failure is logged on every rank (and
        raised by its own handle's ``wait``), never raised here. Saving a step that is already
        committed is a no-op (logged): a step is never overwritten. With tiers, ``step`` goes
        to every tier it is due on, or to ``tier`` ("local", "persistent" or "all") whatever
        the cadence (an emergency save at any step: ``tier="all"``).
        """
        if self._tiered is not None:
            return self._tiered.save(step, state, tier)
        if tier is not None:
            raise ValueError("tier= needs a CheckpointManager built with tiers")
        if self._closed:
            raise CheckpointError("the CheckpointManager is closed")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        t0 = time.monotonic()
        if self._inflight is not None:
            with contextlib.suppress(SaveFailedError):  # logged on every rank by _resolve
                self._resolve(self._inflight, None)
        # The writer is made ready (respawned if it died) before the planning collective, so
        # every rank hands its part over at about the same time; a failure here still plans.
        writer_error = ""
        try:
            self._ensure_writer()
        except Exception as exc:
            writer_error = f"rank {self.rank}: checkpoint writer unusable: {exc}"
        state_dict = _dcp.to_state_dict(state)
        plan, decision = _dcp.make_plan(
            state_dict,
            self._group,
            {"path": self.root},
            lambda: self._decide(step),
            cache=self._plan_cache,
            early=None if writer_error else self._stage,
        )
        if decision.get("error"):
            _events.emit(
                "checkpoint_save_failed", step=step, tier=self.tier, error=decision["error"]
            )
            raise SaveFailedError(f"planning step {step} under {self.root}: {decision['error']}")
        if decision.get("skip") or plan is None:
            logger.info("step %d is already committed under %s; not saved again", step, self.root)
            return SaveHandle(self, None, step)
        nonce = f"{int(decision['nonce']):012x}"
        tmp, final = self._attempt_dirs(step, nonce)
        save = Save(
            step=step,
            nonce=nonce,
            tmp=tmp,
            final=final,
            rank=self.rank,
            world=self.world_size,
            tier=self.tier,
            started=t0,
            writer_timeout_s=self.writer_timeout_s,
            metadata=plan.metadata,
        )
        _events.emit("checkpoint_save_started", step=step, tier=self.tier)
        try:
            if writer_error:
                save.fail(WRITER_FAILED, writer_error)
            else:
                self._stage_and_send(save, plan)
        except (WriterDiedError, WriterHungError) as exc:
            save.fail(WRITER_FAILED, f"rank {self.rank}: checkpoint writer unusable: {exc}")
        except Exception as exc:
            save.fail(IO_FAILED, f"rank {self.rank}: staging step {step} failed: {exc!r}")
        del plan, state_dict
        save.blocked_s = time.monotonic() - t0
        save.handed_over = time.monotonic()  # the writer's deadline counts from here
        self._inflight = save
        save.thread = threading.Thread(
            target=self._complete,
            args=(save, self._writer if save.code == OK else None),
            name=f"ckpt-complete-{step}",
            daemon=True,
        )
        save.thread.start()
        handle = SaveHandle(self, save, step)
        if not self.async_save:
            handle.wait()
        return handle

    # ------------------------------------------------------------------ storage hooks
    # What differs between a shared file system (here) and an object store (_remote_manager).
    def _decide(self, step: int) -> dict[str, Any]:
        """Rank 0, before a save: skip a committed step, else draw the attempt's nonce."""
        if _layout.step_dir(self.root, step).exists():
            return {"skip": True}
        nonce = secrets.randbits(48)
        _layout.tmp_dir(self.root, step, f"{nonce:012x}").mkdir()
        return {"nonce": nonce}

    def _attempt_dirs(self, step: int, nonce: str) -> tuple[Path, Path]:
        """The directory this rank's writer writes into, and the step's committed directory."""
        return _layout.tmp_dir(self.root, step, nonce), _layout.step_dir(self.root, step)

    def _file_prefix(self, prefix: str, nonce: str) -> str:
        """The name prefix of this rank's data files (DCP's own here)."""
        return prefix

    def _complete(self, save: Save, writer: WriterProcess | None) -> None:
        """The completion thread: this rank's part, then the commit (never raises)."""
        complete(save, writer, self.keep_last, self.keep_every)

    def _discard(self, save: Save) -> None:
        """Rank 0, after every rank agreed a save failed: remove what it left."""
        _layout.remove_tree(save.tmp)
        _layout.remove_tree(save.tmp.with_name(".trash-" + save.tmp.name.lstrip(".")))

    def _ensure_writer(self) -> WriterProcess:
        if self._writer is None or not self._writer.alive():
            if self._writer is not None:
                logger.warning(
                    "rank %d: checkpoint writer (pid %d) %s; starting a new one",
                    self.rank,
                    self._writer.pid,
                    self._writer.describe_exit(),
                )
                self._writer.kill()
            self._writer = WriterProcess()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _shutdown, self._writer, self._arena)
        # No wait for its start-up (imports, slow on a loaded node): what is sent waits in its
        # socket, and the completion thread waits for "ready" (see _commit._local_part), so
        # neither the first save after a restart nor a load blocks the training step on it.
        return self._writer

    def _stage_and_send(self, save: Save, plan: _dcp.Plan) -> None:
        writer = self._writer
        assert writer is not None
        if self._staged_for is not plan:  # not staged early (the plan changed, or no writer)
            self._stage(plan)
        self._staged_for = None
        items, slots = self._staged_items, self._staged_slots
        request = {
            "type": "save",
            "job": save.nonce,
            "dir": str(save.tmp),
            "prefix": self._file_prefix(plan.prefix, save.nonce),
            "sync": self._sync_files,
            "items": [
                d if view is not None else _dcp.item_to_json(item, slot.offset, slot.nbytes)
                for d, view, item, slot in zip(
                    self._staging_json, self._staging_views, items, slots, strict=True
                )
            ],
        }
        if not writer.poll_ready():
            # A writer started at this save, or still importing torch since a restart, would
            # hold the next save (and an emergency save) up for seconds: the completion thread
            # writes this one itself from the arena instead.
            arena = self._arena
            save.in_process = lambda: _dcp.write_request(request, arena.mapping)
            return
        if writer.arena_generation != self._arena.generation:
            writer.send_arena(self._arena.fd, self._arena.size, self._arena.generation)
        writer.send(request)

    def _stage(self, plan: _dcp.Plan) -> None:
        """Copy this rank's share of the state into the arena (the only large cost of save)."""
        self._staged_for = None
        items = plan.items()
        values = [plan.resolve(item) for item in items]
        # Tensor slots (and their views) depend only on the plan: computed once per plan and
        # arena; the few serialized objects, whose sizes may vary, go after the tensors.
        if self._staging_key != (plan.version, self._arena.generation):
            tensors = [v if isinstance(v, torch.Tensor) else b"" for v in values]
            self._staging_slots, self._staging_end = _staging.layout(tensors)
            self._staging_views = []
        slots = list(self._staging_slots)
        offset = self._staging_end
        for i, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                slots[i] = _staging.Slot(offset, len(value))
                offset += _staging.align(max(len(value), 1))
        if self._arena.ensure(offset) or not self._staging_views:
            self._staging_json = [
                _dcp.item_to_json(item, slot.offset, slot.nbytes)
                for item, slot in zip(items, slots, strict=True)
            ]
            self._staging_views = [
                self._arena.view(slot, v.dtype, v.shape) if isinstance(v, torch.Tensor) else None
                for slot, v in zip(slots, values, strict=True)
            ]
            self._staging_key = (plan.version, self._arena.generation)
        _staging.stage(self._arena, values, slots, self._staging_views)
        del values
        self._staged_items, self._staged_slots = items, slots
        self._staged_for = plan

    # ------------------------------------------------------------------ agreement
    def _resolve(self, save: Save, timeout: float | None) -> None:
        if not save.resolved:
            bound = save.writer_bound_s + 3 * save.grace_s + 30.0
            if not save.done.wait(bound if timeout is None else timeout):
                if timeout is not None:
                    raise TimeoutError(f"the save of step {save.step} is still in flight")
                save.fail(IO_FAILED, f"rank {self.rank}: completion of step {save.step} stuck")
            code = _agree.max_code(save.code, self._group)
            if code != OK:
                messages = [m for m in _agree.gather_messages(save.message, self._group) if m]
                kind = WriterFailedError if code == WRITER_FAILED else SaveFailedError
                save.error = kind(
                    f"saving step {save.step} under {self.root} failed; the previous is intact: "
                    + "; ".join(messages)
                )
                logger.error("%s", save.error)
                if self.rank == 0:
                    self._discard(save)
            save.resolved = True
            if self._inflight is save:
                self._inflight = None
        if save.error is not None:
            raise save.error

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the save in flight, if any (collective); raises like ``SaveHandle.wait``."""
        if self._tiered is not None:
            self._tiered.wait(timeout)
            return
        if self._inflight is not None:
            self._resolve(self._inflight, timeout)

    # ------------------------------------------------------------------ load
    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step that verifies on every rank (or ``step``) into ``state``.

        A step with a missing manifest, a wrong size or a wrong checksum is skipped with a
        warning that names the file; all ranks load the same step (collective).

        Returns:
            The step loaded, or None when the root holds no checkpoint.

        Raises:
            NoCheckpointError: ``step`` was given and is not committed.
            CheckpointCorruptError: ``step`` (or, with ``step=None``, every committed step)
                failed verification.
        """
        if self._tiered is not None:
            return self._tiered.load(state, step)
        t0 = self._begin_load()
        chosen, nbytes = self._agree_on_step(step)
        if chosen is None:
            return None
        path = _layout.step_dir(self.root, chosen)
        _restore.load_step(state, path, self.rank, self._group)
        duration = time.monotonic() - t0
        _events.emit(
            "checkpoint_loaded",
            step=chosen,
            tier=self.tier,
            bytes=nbytes,
            duration_s=round(duration, 6),
        )
        logger.info("loaded step %d from %s in %.3f s", chosen, path, duration)
        return chosen

    def _begin_load(self) -> float:
        """What every load does first: settle the save in flight, record the start."""
        if self._closed:
            raise CheckpointError("the CheckpointManager is closed")
        with contextlib.suppress(SaveFailedError):
            self.wait()
        _events.emit("checkpoint_load_started", tier=self.tier)
        return time.monotonic()

    def _agree_on_step(self, step: int | None) -> tuple[int | None, int]:
        return _restore.agree_on_step(self.root, self.rank, self.world_size, self._group, step)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Wait for the save in flight (collective), then stop the writer; idempotent."""
        if self._tiered is not None:
            self._tiered.close()
            self._closed = True
            return
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._finalizer()
            self._writer = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shutdown(writer: WriterProcess | None, arena: _staging.Arena) -> None:
    if writer is not None:
        writer.close()
    arena.close()
