"""Load one committed step from an object store, verified: download what this rank reads, check.

The verified reader (``_read.verified``) with two of its options: each rank downloads
(``fetch``) the step's ``.metadata`` and only the data files its own load plan reads
(``only_what_it_reads``) into its node-local spool directory, and reads them in one pass: every
downloaded byte is checked against the manifest's CRC-32 in the same pass that fills the
tensors. A file another rank reads is checked by that rank. The spool copy
is removed afterwards.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import warnings
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from resiliency.checkpoint._read.verified import CorruptShardError, corruption_in, load_verified
from resiliency.checkpoint._remote.store import RemoteRoot, RemoteStoreError

logger = logging.getLogger(__name__)


class _Fetcher:
    """Downloads one step's files from the store into the spool, naming the object on failure."""

    def __init__(self, store: RemoteRoot, step: int, files: dict[str, dict[str, Any]]) -> None:
        self._store, self._step, self._files = store, step, files
        self.fetched_bytes = 0

    def __call__(self, name: str, dest: Path) -> None:
        where = f"{self._store.step_url(self._step)}/{name}"
        try:
            self._store.download(self._step, name, dest)
        except FileNotFoundError:
            raise CorruptShardError(f"{where}: missing") from None
        except (RemoteStoreError, OSError) as exc:
            raise CorruptShardError(f"{where}: could not be downloaded ({exc})") from exc
        self.fetched_bytes += int(self._files[name]["size"])


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
        fetch = _Fetcher(store, step, manifest["files"])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load_verified(
                state, directory, files=manifest["files"], fetch=fetch, only_what_it_reads=True
            )
        logger.debug("step %d: %d bytes downloaded", step, fetch.fetched_bytes)
        return "", ""
    except (Exception, CheckpointException) as exc:
        corrupt = corruption_in(exc)
        if corrupt is not None:  # named by the object in the store, not by its spool copy
            return str(corrupt).replace(str(directory), store.step_url(step)), ""
        return "", f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
