"""The single-root engine: ``step_<N>/`` directories on a file system every rank shares.

The writer writes into ``.tmp-step_<N>-<nonce>/``, rank 0 commits by renaming it (see
``commit``), and a load agrees on the newest step every rank verifies (``restore``), then reads
it through the verified reader.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from resiliency.checkpoint import _events, _layout
from resiliency.checkpoint._engine import restore as _restore
from resiliency.checkpoint._engine import root_check as _root_check
from resiliency.checkpoint._engine.commit import Save, complete
from resiliency.checkpoint._engine.pipeline import SavePipeline
from resiliency.checkpoint._writer.client import WriterProcess
from resiliency.checkpoint.tiers import PersistentTier

logger = logging.getLogger(__name__)


class FileSystemEngine(SavePipeline):
    """Saves and loads under one directory shared by every rank (see the module docstring)."""

    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int | None,
        keep_every: int | None,
        async_save: bool,
        control_group: dist.ProcessGroup | None,
        writer_timeout_s: float,
        tier: str = "persistent",
        eager_writer: bool = True,
    ) -> None:
        super().__init__(
            root,
            keep_last=keep_last,
            keep_every=keep_every,
            async_save=async_save,
            control_group=control_group,
            writer_timeout_s=writer_timeout_s,
            tier=tier,
            eager_writer=eager_writer,
        )

    def _open_root(self, root: str | Path) -> Path:
        path = PersistentTier(root).local_path().resolve()
        _root_check.ensure_writable(path, self.rank)  # not at the first save: see root_check
        if self.rank == 0:
            _layout.remove_stale(path)
        return path

    # ------------------------------------------------------------------ storage hooks
    def _decide(self, step: int) -> dict[str, Any]:
        if _layout.step_dir(self.root, step).exists():
            return {"skip": True}
        nonce = secrets.randbits(48)
        _layout.tmp_dir(self.root, step, f"{nonce:012x}").mkdir()
        return {"nonce": nonce}

    def _attempt_dirs(self, step: int, nonce: str) -> tuple[Path, Path]:
        return _layout.tmp_dir(self.root, step, nonce), _layout.step_dir(self.root, step)

    def _file_prefix(self, prefix: str, nonce: str) -> str:
        return prefix  # DCP's own: one attempt per temporary directory

    def _complete(self, save: Save, writer: WriterProcess | None) -> None:
        complete(save, writer, self.keep_last, self.keep_every)

    def _discard(self, save: Save) -> None:
        _layout.remove_tree(save.tmp)
        _layout.remove_tree(save.tmp.with_name(".trash-" + save.tmp.name.lstrip(".")))

    # ------------------------------------------------------------------ queries and load
    def steps(self) -> list[int]:
        return _layout.committed_steps(self.root)

    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        t0 = self._begin_load()
        chosen, nbytes = _restore.agree_on_step(
            self.root, self.rank, self.world_size, self._group, step
        )
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
