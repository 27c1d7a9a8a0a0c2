"""Load one committed step from an object store, verified: download what this rank reads, check.

Each rank downloads the step's ``.metadata`` and only the data files its own load plan reads
(into its node-local spool directory), then reads them with the one-pass verifying reader of
``_verified_read``: every downloaded byte is checked against the manifest's CRC-32 in the same
pass that fills the tensors. A file another rank reads is checked by that rank. The spool copy
is removed afterwards.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from resiliency.checkpoint._read.verified import CorruptShardError, VerifyingReader, corruption_in
from resiliency.checkpoint._remote.store import RemoteRoot, RemoteStoreError

logger = logging.getLogger(__name__)


class _RemoteReader(VerifyingReader):
    """The verifying reader over a spool directory that it fills from the store on demand."""

    def __init__(
        self, store: RemoteRoot, step: int, spool: Path, files: dict[str, dict[str, Any]]
    ) -> None:
        super().__init__(spool, files)
        self._store, self._step, self._spool = store, step, spool
        self.fetched_bytes = 0

    def _fetch(self, name: str) -> None:
        where = f"{self._store.step_url(self._step)}/{name}"
        if name not in self._files:
            raise CorruptShardError(f"{where}: not in the manifest")
        try:
            self._store.download(self._step, name, self._spool / name)
        except FileNotFoundError:
            raise CorruptShardError(f"{where}: missing") from None
        except (RemoteStoreError, OSError) as exc:
            raise CorruptShardError(f"{where}: could not be downloaded ({exc})") from exc
        self.fetched_bytes += int(self._files[name]["size"])

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # Checked before DCP unpickles it (and turns any error into a string).
        self._fetch(".metadata")
        self.check_whole(".metadata")
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        needed = {self.storage_data[r.storage_index].relative_path for r in plan.items}
        for name in sorted(needed):
            self._fetch(name)
        # Files no item of this rank reads stay in the store: other ranks check theirs.
        self._files = {n: e for n, e in self._files.items() if n in needed or n == ".metadata"}
        return super().read_data(plan, planner)


def load_step(state: dict[str, Any], store: RemoteRoot, step: int, spool: Path) -> tuple[str, str]:
    """Load ``step`` into ``state``; return ``(problem, error)``, both "" on success.

    ``problem``: the step is unusable (missing or bad manifest, a missing, torn or corrupt
    file, a failed download): another step may be tried. ``error``: anything else (the state
    does not match the checkpoint), which no other step would fix.
    """
    try:
        manifest = store.read_manifest(step)
    except ValueError as exc:
        return str(exc), ""
    directory = spool / f"restore-step_{step}-{secrets.token_hex(4)}"
    try:
        directory.mkdir(parents=True)
        reader = _RemoteReader(store, step, directory, manifest["files"])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, no_dist=True)
        logger.debug("step %d: %d bytes downloaded", step, reader.fetched_bytes)
        return "", ""
    except (Exception, CheckpointException) as exc:
        corrupt = corruption_in(exc)
        if corrupt is not None:  # named by the object in the store, not by its spool copy
            return str(corrupt).replace(str(directory), store.step_url(step)), ""
        return "", f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
