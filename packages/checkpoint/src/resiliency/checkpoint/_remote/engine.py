"""The object-store engine: a persistent tier at a URL (``s3://``, ``gs://``...) via fsspec.

Saving is the same as on a shared file system up to the writer (planning, staging, the writer
process), except that each rank's writer writes into a node-local spool directory under file
names that carry the save's nonce; the commit is ``_remote_commit``'s, loading is
``_remote_read``'s. Users reach it through ``CheckpointManager("s3://...")`` or
``PersistentTier("s3://...")``; see docs/checkpoint.md, "Object stores".
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from resiliency.checkpoint import _events
from resiliency.checkpoint._collectives import agree as _agree
from resiliency.checkpoint._collectives import json_exchange as _json_collectives
from resiliency.checkpoint._engine.commit import Save
from resiliency.checkpoint._engine.pipeline import SavePipeline
from resiliency.checkpoint._remote import commit as _remote_commit
from resiliency.checkpoint._remote import read as _remote_read
from resiliency.checkpoint._remote.store import RemoteRoot, RemoteStoreError
from resiliency.checkpoint._writer.client import STARTUP_TIMEOUT_S, WriterProcess
from resiliency.checkpoint.errors import CheckpointCorruptError, CheckpointError, NoCheckpointError
from resiliency.checkpoint.tiers import PersistentTier

logger = logging.getLogger(__name__)


class ObjectStoreEngine(SavePipeline):
    """The save pipeline and a verified load over an object store (see the module docstring).

    Args:
        tier: the persistent tier: its URL, retention, storage options and spool directory.
        async_save: as for ``CheckpointManager``.
        control_group: the gloo group of the small collectives (None: one process).
        writer_timeout_s: as for ``CheckpointManager``; also the deadline of every single
            call into the store (an upload, a download, a listing).
        eager_writer: as for ``CheckpointManager``.
    """

    # Spool files are uploaded, then deleted: flushing them to the local disk first buys nothing.
    _sync_files = False

    def __init__(
        self,
        tier: PersistentTier,
        *,
        async_save: bool,
        control_group: dist.ProcessGroup | None,
        writer_timeout_s: float,
        eager_writer: bool,
    ) -> None:
        self._spec = tier
        self.url = str(tier.path).rstrip("/")
        super().__init__(
            self.url,
            keep_last=tier.keep_last,
            keep_every=tier.keep_every,
            async_save=async_save,
            control_group=control_group,
            writer_timeout_s=writer_timeout_s,
            tier="persistent",
            eager_writer=eager_writer,
        )

    def _open_root(self, root: Any) -> Path:
        self._store = RemoteRoot(self.url, self._spec.storage_options, self.writer_timeout_s)
        # Outlasts every bounded wait of a completion (writer start-up and save, upload, commit)
        # so that only a dead or silent rank ever times its collectives out.
        bound = max(STARTUP_TIMEOUT_S, self.writer_timeout_s) + 3 * self.writer_timeout_s + 60
        self._side: dist.ProcessGroup | None = None
        if self._group is not None:
            self._side = dist.new_group(
                dist.get_process_group_ranks(self._group),
                backend="gloo",
                timeout=timedelta(seconds=bound),
            )
        base = Path(self._spec.spool_dir or tempfile.gettempdir()).resolve()
        digest = hashlib.blake2b(self.url.encode(), digest_size=6).hexdigest()
        shared = base / f"resiliency-spool-{digest}"
        _remove_dead_spools(shared)
        spool = shared / f"rank{self.rank}-pid{os.getpid()}-{secrets.token_hex(3)}"
        spool.mkdir(parents=True)
        if self.rank == 0:
            try:
                self._store.remove_uncommitted()
            except (RemoteStoreError, OSError) as exc:
                logger.warning("could not clean up %s: %s", self.url, exc)
        return spool

    def close(self, abort: bool = False) -> None:
        """As the pipeline's; then remove this engine's spool directory."""
        try:
            super().close(abort)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ storage hooks
    def _decide(self, step: int) -> dict[str, Any]:
        if self._store.is_committed(step):
            return {"skip": True}
        return {"nonce": secrets.randbits(48)}

    def _attempt_dirs(self, step: int, nonce: str) -> tuple[Path, Path]:
        spool = self.root / f"step_{step}-{nonce}"
        spool.mkdir(parents=True, exist_ok=True)
        return spool, spool

    def _file_prefix(self, prefix: str, nonce: str) -> str:
        return f"{prefix}{nonce}_"  # "__<rank>_<nonce>_0.distcp": never another attempt's

    def _complete(self, save: Save, writer: WriterProcess | None) -> None:
        _remote_commit.complete(
            save,
            writer,
            self._store,
            group=self._side,
            keep_last=self.keep_last,
            keep_every=self.keep_every,
        )

    def _discard(self, save: Save) -> None:
        """Nothing: the completion already deleted the attempt's objects and spool files."""

    # ------------------------------------------------------------------ queries
    def steps(self) -> list[int]:
        """Committed steps in the store, ascending (a listing; ``load`` verifies).

        A store that cannot be listed counts as empty, with a warning: a restore then falls
        back to another tier, or starts afresh, instead of failing the job.
        """
        try:
            return self._store.committed_steps()
        except (RemoteStoreError, OSError) as exc:
            logger.warning("could not list %s: %s", self.url, exc)
            return []

    # ------------------------------------------------------------------ load
    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step that verifies on every rank (or ``step``) into ``state``."""
        t0 = self._begin_load()
        listing = self.steps()
        if step is not None:
            missing = _agree.min_max([int(step not in listing)], self._group)[1][0]
            if missing:
                raise NoCheckpointError(f"step {step} is not committed under {self.url}")
            listing = [step]
        bad: dict[int, str] = {}
        bound: int | None = None
        while True:
            candidate = next(
                (s for s in reversed(listing) if s not in bad and (bound is None or s <= bound)),
                -1,
            )
            mins, maxs = _agree.min_max([candidate], self._group)
            if mins[0] != maxs[0]:  # the ranks' listings differ: retry below the lowest
                bound = mins[0]
                if bound >= 0:
                    continue
            if mins[0] < 0:
                break
            chosen = mins[0]
            problem, error = _remote_read.load_step(state, self._store, chosen, self.root)
            verdicts = _json_collectives.all_gather_json([problem, error], self._group)
            errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(verdicts) if e]
            if errors:
                raise CheckpointError(
                    f"loading {self._store.step_url(chosen)} failed: {'; '.join(errors)}"
                )
            problems = [f"rank {r}: {p}" for r, (p, _) in enumerate(verdicts) if p]
            if not problems:
                self._loaded(chosen, time.monotonic() - t0)
                return chosen
            bad[chosen] = "; ".join(problems)
            logger.warning("checkpoint step %d skipped: %s", chosen, bad[chosen])
            bound = None
        if step is not None:
            raise CheckpointCorruptError(
                f"step {step} under {self.url} failed verification: {bad.get(step, '')}"
            )
        if bad:
            raise CheckpointCorruptError(
                f"no committed step under {self.url} verifies on every rank; see the warnings"
            )
        return None

    def _loaded(self, step: int, duration: float) -> None:
        try:
            nbytes = int(self._store.read_manifest(step).get("bytes", 0))
        except ValueError:
            nbytes = 0
        _events.emit(
            "checkpoint_loaded",
            step=step,
            tier=self.tier,
            bytes=nbytes,
            duration_s=round(duration, 6),
        )
        logger.info("loaded step %d from %s in %.3f s", step, self.url, duration)


_SPOOL_RE = re.compile(r"^rank\d+-pid(\d+)-[0-9a-f]+$")


def _remove_dead_spools(shared: Path) -> None:
    """Remove the spool directories of processes on this node that no longer run."""
    try:
        names = os.listdir(shared)
    except FileNotFoundError:
        return
    for name in names:
        match = _SPOOL_RE.match(name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            logger.info("removing %s, left by a process that ended", shared / name)
            shutil.rmtree(shared / name, ignore_errors=True)
        except PermissionError:  # alive, another user's
            continue
