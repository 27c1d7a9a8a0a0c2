"""The completion of one save on an object store, run off the training thread.

1. Each rank's writer writes its share into the rank's node-local spool directory (file names
   carry the save's nonce); the rank uploads those files under ``step_<N>/``.
2. Every rank's outcome (write results and file checksums, or what failed) is exchanged on a
   gloo group of the manager's own, used only by these completion threads (one save at a time,
   so the collectives of two saves never interleave). No marker objects and no polling of the
   store: a shared file system's ``.part-<rank>`` markers have no cheap equivalent there.
3. Rank 0 writes DCP's ``.metadata``, uploads it, then uploads ``manifest.json``: the object
   appears whole or not at all, and its presence is the commit point. On failure it deletes the
   attempt's objects instead.
4. Rank 0's verdict is exchanged the same way, so every rank knows the outcome; then rank 0
   applies retention. The spool directory is removed on every path.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

import torch.distributed as dist

from resiliency.checkpoint import _layout
from resiliency.checkpoint._collectives.json_exchange import all_gather_json
from resiliency.checkpoint._engine.commit import (
    IO_FAILED,
    OK,
    WRITER_FAILED,
    Save,
    report,
    write_metadata,
    write_part,
)
from resiliency.checkpoint._remote.store import RemoteRoot, RemoteStoreError
from resiliency.checkpoint._writer.client import WriterProcess

logger = logging.getLogger(__name__)


def _upload(save: Save, store: RemoteRoot, part: dict[str, Any]) -> dict[str, Any] | None:
    t0 = time.monotonic()
    try:
        for name in sorted(part["files"]):
            store.upload(save.tmp / name, save.step, name)
    except (RemoteStoreError, OSError) as exc:
        save.fail(
            IO_FAILED,
            f"rank {save.rank}: uploading its part of step {save.step} to {store.url} failed: "
            f"{exc}",
        )
        return None
    logger.debug(
        "rank %d: step %d uploaded (%d bytes) in %.3f s",
        save.rank,
        save.step,
        save.bytes,
        time.monotonic() - t0,
    )
    return part


def _commit(save: Save, store: RemoteRoot, parts: list[dict[str, Any]]) -> None:
    """Rank 0: ``.metadata``, then the manifest (the commit point)."""
    files, size = write_metadata(save, parts)
    if store.is_committed(save.step):  # another job's save of the same root: never overwrite
        raise RemoteStoreError(f"{store.step_url(save.step)} was committed by someone else")
    store.upload(save.tmp / ".metadata", save.step, ".metadata")
    with save.commit_lock:
        if save.abandoned:
            raise RemoteStoreError(f"the save of step {save.step} was abandoned")
        store.put_bytes(
            save.step,
            _layout.MANIFEST,
            _layout.build_manifest(save.step, save.nonce, save.world, files),
        )
        save.committed = True
    save.bytes += size


def _settle(save: Save, store: RemoteRoot, parts: list[dict[str, Any]]) -> str:
    """Rank 0: commit when every part arrived, else clean up; return the failure or ""."""
    failed = [str(p["failed"]) for p in parts if "failed" in p]
    outcome = "; ".join(failed)
    if not failed:
        try:
            _commit(save, store, parts)
        except Exception as exc:
            outcome = f"rank 0: committing step {save.step} to {store.url} failed: {exc}"
    if outcome:
        try:
            store.remove_files(save.step, save.nonce)
        except (RemoteStoreError, OSError) as exc:
            logger.warning(
                "could not delete the objects of the failed save of step %d: %s", save.step, exc
            )
    return outcome


def complete(
    save: Save,
    writer: WriterProcess | None,
    store: RemoteRoot,
    *,
    group: dist.ProcessGroup | None,
    keep_last: int | None,
    keep_every: int | None,
) -> None:
    """Run the whole completion of ``save`` on an object store; never raises."""
    try:
        part = write_part(save, writer)
        if part is not None:
            part = _upload(save, store, part)
        mine = part if part is not None else {"failed": save.message or f"rank {save.rank}"}
        try:
            parts = all_gather_json(mine, group)
            verdict = _settle(save, store, parts) if save.rank == 0 else ""
            verdict = all_gather_json(verdict, group)[0]
        except RuntimeError as exc:  # the group's timeout: a rank died or stopped answering
            save.fail(
                WRITER_FAILED,
                f"rank {save.rank}: the ranks' outcomes of step {save.step} could not be "
                f"exchanged: {exc}",
            )
            return
        if verdict:
            save.fail(IO_FAILED, verdict)
        elif save.code == OK and save.rank == 0:
            try:
                store.apply_retention(keep_last, keep_every)
            except (RemoteStoreError, OSError) as exc:
                logger.warning("retention under %s failed: %s", store.url, exc)
    except Exception as exc:  # a bug must not leave the training thread waiting forever
        logger.exception("completing the save of step %d failed", save.step)
        save.fail(IO_FAILED, f"rank {save.rank}: {exc!r}")
    finally:
        shutil.rmtree(save.tmp, ignore_errors=True)
        report(save)
