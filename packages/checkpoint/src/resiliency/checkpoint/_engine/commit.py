"""The completion of one save, run off the training thread: local part, then the commit.

Every rank waits for its own writer's answer (bounded by ``writer_timeout_s``) and leaves a
marker in the temporary directory: ``.part-<rank>.json`` (its write results and file checksums)
or an empty ``.part-<rank>.failed``. Rank 0 waits for every marker, writes DCP's ``.metadata``
and the manifest, fsyncs, renames the directory to ``step_<N>`` and fsyncs the root: the rename
is the commit point. On failure it leaves an empty ``.abort``. The other ranks learn the outcome
from the committed directory (its manifest carries the save's nonce) or from ``.abort``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resiliency.checkpoint import _events, _layout
from resiliency.checkpoint._dcp import planning as _dcp
from resiliency.checkpoint._writer.client import (
    STARTUP_TIMEOUT_S,
    WriterDiedError,
    WriterHungError,
    WriterProcess,
)

logger = logging.getLogger(__name__)

OK, IO_FAILED, WRITER_FAILED = 0, 1, 2
_POLL_MIN_S, _POLL_MAX_S = 0.002, 0.05


@dataclass
class Save:
    """One save in flight and its local outcome."""

    step: int
    nonce: str
    tmp: Path
    final: Path
    rank: int
    world: int
    tier: str
    started: float
    writer_timeout_s: float
    handed_over: float = 0.0
    metadata: Any = None  # DCP's global metadata, rank 0 only
    # Set when the writer was not ready at the hand-over: the completion thread writes the
    # staged request itself (returns the writer's "done" reply).
    in_process: Callable[[], dict[str, Any]] | None = None
    blocked_s: float = 0.0
    code: int = OK
    message: str = ""
    bytes: int = 0
    total_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    resolved: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None
    # Set by ``abandon`` (``close(abort=True)``): the save is never committed from then on.
    # The lock makes the check and the commit point one step, so an abandoned save is either
    # committed before the abandonment or never.
    abandoned: bool = False
    committed: bool = False
    commit_lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, code: int, message: str) -> None:
        if self.code == OK:
            self.code, self.message = code, message

    @property
    def grace_s(self) -> float:
        return 5.0 + 0.1 * self.writer_timeout_s

    @property
    def writer_bound_s(self) -> float:
        """The longest a rank's writer may take from the hand-over: start-up, then the save."""
        return max(STARTUP_TIMEOUT_S, self.writer_timeout_s) + self.writer_timeout_s


def _sleep(poll: float) -> float:
    time.sleep(poll)
    return min(poll * 2, _POLL_MAX_S)


def _mark(save: Save, payload: dict[str, Any] | None) -> None:
    """Leave this rank's marker; a failure marker is an empty file (works on a full disk)."""
    if payload is not None:
        tmp = save.tmp / f".part-{save.rank}.json.tmp"
        try:
            _layout.write_durable(tmp, json.dumps(payload).encode())
            tmp.rename(save.tmp / f".part-{save.rank}.json")
            return
        except OSError as exc:
            save.fail(IO_FAILED, f"rank {save.rank}: could not write its part marker: {exc}")
    try:
        os.close(os.open(save.tmp / f".part-{save.rank}.failed", os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError as exc:
        logger.error(
            "rank %d could not mark its failed save of step %d: %s", save.rank, save.step, exc
        )


def _abort(save: Save) -> None:
    try:
        os.close(os.open(save.tmp / ".abort", os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError:
        # Even an empty file does not fit: take the directory out of the way instead.
        try:
            save.tmp.rename(save.tmp.with_name(".trash-" + save.tmp.name.lstrip(".")))
        except OSError as exc:
            logger.error("could not mark the save of step %d aborted: %s", save.step, exc)


def _local_part(save: Save, writer: WriterProcess | None) -> dict[str, Any] | None:
    """Wait for this rank's writer; return its results or None (failure recorded in save)."""
    if save.code != OK or writer is None:
        return None
    try:
        # A writer spawned at this save (or still importing since the last restart) says
        # "ready" first; its start-up is not bounded by the save timeout.
        writer.wait_ready(save.handed_over + max(STARTUP_TIMEOUT_S, save.writer_timeout_s))
        reply = writer.recv(time.monotonic() + save.writer_timeout_s)
    except WriterDiedError as exc:
        save.fail(
            WRITER_FAILED, f"rank {save.rank}: checkpoint {exc} while saving step {save.step}"
        )
        return None
    except WriterHungError:
        writer.kill()
        save.fail(
            WRITER_FAILED,
            f"rank {save.rank}: checkpoint writer (pid {writer.pid}) hung: no answer within "
            f"writer_timeout_s={save.writer_timeout_s:g} s while saving step {save.step}; killed",
        )
        return None
    except Exception as exc:
        writer.kill()
        save.fail(WRITER_FAILED, f"rank {save.rank}: writer protocol error: {exc}")
        return None
    if reply.get("type") == "error" or reply.get("job") != save.nonce:
        save.fail(
            IO_FAILED,
            f"rank {save.rank}: writing step {save.step} failed: {reply.get('error', reply)}",
        )
        return None
    return {"results": reply["results"], "files": reply["files"]}


def _write_in_process(save: Save, write: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    t0 = time.monotonic()
    try:
        reply = write()
    except Exception as exc:
        save.fail(IO_FAILED, f"rank {save.rank}: writing step {save.step} failed: {exc!r}")
        return None
    logger.info(
        "rank %d: step %d written by the rank itself in %.3f s (its writer process was still "
        "starting)",
        save.rank,
        save.step,
        time.monotonic() - t0,
    )
    return {"results": reply["results"], "files": reply["files"]}


def _wait_parts(save: Save) -> list[dict[str, Any]] | None:
    """Rank 0: wait for every rank's marker; None when one failed or never came."""
    deadline = save.handed_over + save.writer_bound_s + save.grace_s
    pending = set(range(save.world))
    parts: dict[int, dict[str, Any]] = {}
    poll = _POLL_MIN_S
    while pending:
        names = set(os.listdir(save.tmp))
        for rank in sorted(pending):
            if f".part-{rank}.failed" in names:
                save.fail(IO_FAILED, f"rank {rank} failed its part of step {save.step}")
                return None
            if f".part-{rank}.json" in names:
                parts[rank] = json.loads((save.tmp / f".part-{rank}.json").read_text())
                pending.discard(rank)
        if not pending:
            break
        if save.abandoned:
            save.fail(IO_FAILED, f"the save of step {save.step} was abandoned")
            return None
        if time.monotonic() > deadline:
            save.fail(
                WRITER_FAILED,
                f"ranks {sorted(pending)} reported nothing for step {save.step} within "
                f"{deadline - save.handed_over:.0f} s",
            )
            return None
        poll = _sleep(poll)
    return [parts[r] for r in range(save.world)]


def write_metadata(save: Save, parts: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """Rank 0: write DCP's ``.metadata`` into ``save.tmp``; return every file's manifest entry
    (the ranks' files and ``.metadata``) and the size of ``.metadata``."""
    _dcp.finish(save.tmp, save.metadata, [p["results"] for p in parts])
    files: dict[str, dict[str, Any]] = {}
    for part in parts:
        files.update(part["files"])
    size, crc = _layout.file_checksum(save.tmp / ".metadata")
    files[".metadata"] = {"size": size, "crc32": crc}
    return files, size


def _commit(save: Save, parts: list[dict[str, Any]]) -> bool:
    """Rank 0: ``.metadata``, manifest, fsync, rename, fsync root; False when abandoned."""
    files, size = write_metadata(save, parts)
    for rank in range(save.world):
        (save.tmp / f".part-{rank}.json").unlink()
    manifest = _layout.build_manifest(save.step, save.nonce, save.world, files)
    _layout.write_durable(save.tmp / _layout.MANIFEST, manifest)
    _layout.fsync_dir(save.tmp)
    with save.commit_lock:
        if save.abandoned:
            return False
        save.tmp.rename(save.final)  # the commit point; fails if the step exists (never overwrite)
        save.committed = True
    _layout.fsync_dir(save.final.parent)
    save.bytes += size
    return True


def _await_commit(save: Save) -> None:
    """Ranks > 0: wait until rank 0 committed (our nonce) or aborted."""
    deadline = save.handed_over + save.writer_bound_s + 2 * save.grace_s
    poll = _POLL_MIN_S
    while True:
        if (save.final / _layout.MANIFEST).exists():
            try:
                nonce = json.loads((save.final / _layout.MANIFEST).read_text()).get("nonce")
            except (OSError, ValueError):
                nonce = None
            if nonce == save.nonce:
                return
        if save.abandoned:
            save.fail(IO_FAILED, f"the save of step {save.step} was abandoned")
            return
        gone = (save.tmp / ".abort").exists() or not save.tmp.exists()
        if gone and not (save.final / _layout.MANIFEST).exists():
            save.fail(IO_FAILED, f"rank 0 aborted the save of step {save.step}")
            return
        if time.monotonic() > deadline:
            save.fail(IO_FAILED, f"rank 0 did not commit step {save.step} in time")
            return
        poll = _sleep(poll)


def write_part(save: Save, writer: WriterProcess | None) -> dict[str, Any] | None:
    """This rank's part of ``save``: its writer's results (or its own, while the writer starts).

    Returns None on failure (recorded in ``save``); never raises.
    """
    if save.in_process is not None and save.code == OK:
        part = _write_in_process(save, save.in_process)
    else:
        part = _local_part(save, writer)
    if part is not None:
        save.bytes = sum(int(f["size"]) for f in part["files"].values())
    return part


def report(save: Save) -> None:
    """Record the outcome of ``save`` (goodput event, log) and wake its waiters."""
    save.total_s = time.monotonic() - save.started
    if save.code == OK:
        _events.saved(save.step, save.tier, save.bytes, save.blocked_s, save.total_s)
        logger.info(
            "step %d saved: blocked %.3f s, durable after %.3f s, %d bytes from rank %d",
            save.step,
            save.blocked_s,
            save.total_s,
            save.bytes,
            save.rank,
        )
    else:
        _events.emit("checkpoint_save_failed", step=save.step, tier=save.tier, error=save.message)
        logger.error("save of step %d failed: %s", save.step, save.message)
    save.done.set()


def abandon(save: Save, lock_timeout_s: float = 5.0) -> bool:
    """Give ``save`` up without any collective (``close(abort=True)``); never raises.

    From now on nobody commits it: this rank's completion stops waiting, rank 0 never renames
    it, and a live rank 0 of another process sees this rank's failure marker (unless it already
    committed). What the attempt left under its ``.tmp-`` directory is removed like any
    uncommitted save's: by rank 0 of the next manager opening the root (``remove_stale``).

    Returns:
        False when this rank had already committed the step (rank 0 before the call), else True.
    """
    if not save.commit_lock.acquire(timeout=lock_timeout_s):
        # Only the commit point holds the lock (a rename, or an object store's manifest
        # upload): it is under way, so the step may still appear.
        save.abandoned = True
        logger.error(
            "rank %d: the commit of step %d is under way (lock held %.0f s); it may still appear",
            save.rank,
            save.step,
            lock_timeout_s,
        )
        return True
    try:
        save.abandoned = True
        if save.committed:
            return False
    finally:
        save.commit_lock.release()
    if save.tmp.is_dir():
        _mark(save, None)  # a rank 0 still waiting for the parts gives the step up
    return True


def complete(
    save: Save, writer: WriterProcess | None, keep_last: int | None, keep_every: int | None
) -> None:
    """Run the whole completion of ``save``; never raises (the outcome is in ``save``)."""
    try:
        _mark(save, write_part(save, writer))
        if save.rank == 0:
            parts = _wait_parts(save) if save.code == OK else None
            if parts is None:
                _abort(save)
            else:
                try:
                    if not _commit(save, parts):
                        save.fail(IO_FAILED, f"the save of step {save.step} was abandoned")
                        _abort(save)
                except Exception as exc:
                    save.fail(IO_FAILED, f"rank 0: committing step {save.step} failed: {exc}")
                    _abort(save)
            if save.code == OK:
                try:
                    _layout.apply_retention(save.final.parent, keep_last, keep_every)
                except OSError as exc:
                    logger.warning("retention under %s failed: %s", save.final.parent, exc)
        elif save.code == OK:
            _await_commit(save)
    except Exception as exc:  # a bug must not leave the training thread waiting forever
        logger.exception("completing the save of step %d failed", save.step)
        save.fail(IO_FAILED, f"rank {save.rank}: {exc!r}")
    finally:
        report(save)
