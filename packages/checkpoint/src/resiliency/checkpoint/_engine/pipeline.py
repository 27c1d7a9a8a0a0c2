"""The save pipeline the single-root and object-store engines share.

Saving is the same wherever the files go: DCP's planning (cached, agreed by every rank), a copy
of this rank's share into the staging arena (the only cost the training step sees), the
hand-over to the persistent writer process, and a completion thread that waits for the writer
and commits. ``wait`` makes every rank agree on the outcome. What differs between a shared file
system and an object store (where the writer writes, the file names, the commit, the load) is a
handful of hooks that :class:`~resiliency.checkpoint._engine.file_system.FileSystemEngine` and
:class:`~resiliency.checkpoint._remote.engine.ObjectStoreEngine` implement.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from resiliency.checkpoint import _events
from resiliency.checkpoint._collectives import agree as _agree
from resiliency.checkpoint._dcp import planning as _dcp
from resiliency.checkpoint._dcp import staging as _staging
from resiliency.checkpoint._engine import commit as _commit
from resiliency.checkpoint._engine.abandon import stop_abandoned
from resiliency.checkpoint._engine.commit import IO_FAILED, OK, WRITER_FAILED, Save
from resiliency.checkpoint._writer.client import WriterDiedError, WriterHungError, WriterProcess
from resiliency.checkpoint.errors import CheckpointError, SaveFailedError, WriterFailedError

logger = logging.getLogger(__name__)


class SaveHandle:
    """The handle of one save: ``done()`` is local, ``wait()`` is collective."""

    def __init__(self, manager: SavePipeline, save: Save | None, step: int) -> None:
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


class SavePipeline:
    """Planning, staging, the writer, the completion and the agreement, under one root.

    Args:
        root: the directory or URL the engine saves under (``_open_root`` makes it ready).
        keep_last: keep the newest N committed steps (None: keep all).
        keep_every: also keep forever every step divisible by this number.
        async_save: when False, ``save`` returns only once the step is committed.
        control_group: the gloo group of the small collectives (None: one process).
        writer_timeout_s: bound on one save's writing.
        tier: the goodput tier name of this engine's saves.
        eager_writer: start the writer process now (True) or at the first save.
    """

    _sync_files = True  # the writer fsyncs what it writes (the files are the checkpoint)

    def __init__(
        self,
        root: Any,
        *,
        keep_last: int | None,
        keep_every: int | None,
        async_save: bool,
        control_group: dist.ProcessGroup | None,
        writer_timeout_s: float,
        tier: str,
        eager_writer: bool,
    ) -> None:
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.async_save = async_save
        self.writer_timeout_s = float(writer_timeout_s)
        self.tier = tier
        self._group = control_group
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

    # ------------------------------------------------------------------ storage hooks
    def _open_root(self, root: Any) -> Path:
        """Make the root ready (collective); return the directory the writer writes under."""
        raise NotImplementedError

    def _decide(self, step: int) -> dict[str, Any]:
        """Rank 0, before a save: ``{"skip": True}`` for a committed step, else a ``nonce``."""
        raise NotImplementedError

    def _attempt_dirs(self, step: int, nonce: str) -> tuple[Path, Path]:
        """The directory this rank's writer writes into, and the step's committed directory."""
        raise NotImplementedError

    def _file_prefix(self, prefix: str, nonce: str) -> str:
        """The name prefix of this rank's data files."""
        raise NotImplementedError

    def _complete(self, save: Save, writer: WriterProcess | None) -> None:
        """The completion thread: this rank's part, then the commit (never raises)."""
        raise NotImplementedError

    def _discard(self, save: Save) -> None:
        """Rank 0, after every rank agreed a save failed: remove what it left."""
        raise NotImplementedError

    def steps(self) -> list[int]:
        """Committed steps under the root, ascending (a listing; ``load`` verifies)."""
        raise NotImplementedError

    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step that verifies on every rank (or ``step``) into ``state``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ queries (local)
    @property
    def writer_pid(self) -> int | None:
        """The pid of this rank's writer process (None after ``close``)."""
        return self._writer.pid if self._writer is not None else None

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: dict[str, Any], tier: str | None = None) -> SaveHandle:
        """Save ``state`` as ``step``; returns once the state is staged (collective).

        Blocks training only for DCP's planning and the copy into the staging arena. A previous
        save still in flight is waited for first; its failure is logged on every rank (and
        raised by its own handle's ``wait``), never raised here. Saving a step that is already
        committed is a no-op (logged): a step is never overwritten. ``tier`` belongs to the
        tiered engine's protocol; the facade refuses it for a single root.
        """
        if self._closed:
            raise CheckpointError("the CheckpointManager is closed")
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

    # ------------------------------------------------------------------ writer and staging
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
        if self._inflight is not None:
            self._resolve(self._inflight, timeout)

    # ------------------------------------------------------------------ load
    def _begin_load(self) -> float:
        """What every load does first: settle the save in flight, record the start."""
        if self._closed:
            raise CheckpointError("the CheckpointManager is closed")
        with contextlib.suppress(SaveFailedError):
            self.wait()
        _events.emit("checkpoint_load_started", tier=self.tier)
        return time.monotonic()

    def close(self, abort: bool = False) -> None:
        """Wait for the save in flight (collective), then stop the writer; idempotent.

        Args:
            abort: no collective at all (a peer may be dead, the groups aborted): the save in
                flight is abandoned, never committed, and the writer is killed.
        """
        if self._closed:
            return
        if abort:
            self._abort_close()
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._finalizer()
            self._writer = None

    def _abort_close(self) -> None:
        """``close(abort=True)``: abandon the save in flight, kill the writer, free the arena."""
        self._closed = True
        save, self._inflight = self._inflight, None
        writer, self._writer = self._writer, None
        try:
            if save is not None and not save.resolved:
                self._abandon(save)
            stop_abandoned(
                writer,
                save.thread if save is not None else None,
                rank=self.rank,
                step=save.step if save is not None else -1,
            )
        finally:
            self._finalizer()

    def _abandon(self, save: Save) -> None:
        if not _commit.abandon(save):
            logger.warning(
                "rank %d: close(abort=True): step %d was already committed under %s; its "
                "agreement with the other ranks is skipped",
                self.rank,
                save.step,
                self.root,
            )
            save.resolved = True
            return
        save.error = SaveFailedError(
            f"rank {self.rank}: the save of step {save.step} under {self.root} was abandoned "
            "by close(abort=True); the previous committed step is intact"
        )
        save.resolved = True
        logger.warning(
            "rank %d: close(abort=True): abandoning the save of step %d in flight under %s "
            "(no agreement with the other ranks: a peer may be dead or the process groups "
            "aborted); it will not be committed",
            self.rank,
            save.step,
            self.root,
        )


def _shutdown(writer: WriterProcess | None, arena: _staging.Arena) -> None:
    if writer is not None:
        writer.close()
    arena.close()
