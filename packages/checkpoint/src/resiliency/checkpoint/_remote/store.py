"""An object-store checkpoint root reached through fsspec: listing, uploads, downloads, deletes.

Layout under the URL (the same names as on a shared file system, and a standard DCP checkpoint
per committed step)::

    <url>/step_<N:09d>/.metadata                  DCP's metadata (rank 0, at the commit)
    <url>/step_<N:09d>/__<r>_<nonce>_0.distcp     rank r's data; the nonce names the attempt
    <url>/step_<N:09d>/manifest.json              uploaded LAST: its presence is the commit

Object stores have no rename, so a step prefix is written in place; the nonce in every data
file's name keeps the files of a failed attempt (or a late upload of one) from ever replacing
those a later attempt commits. A prefix without a manifest is an attempt that never committed.

Every call into the store runs under a deadline (a helper thread): a store that stops answering
fails the save or the load with a message naming the object, instead of hanging the job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from resiliency.checkpoint import _layout
from resiliency.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step_(\d{9,})$")
_T = TypeVar("_T")

# Per-process stores: every rank would see a different, empty one.
_REFUSED = {"memory": "it lives inside one process, so the other ranks would not see it"}


class RemoteStoreError(CheckpointError, OSError):
    """A call into the object store failed or did not answer in time."""


def open_filesystem(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the root path in it (no trailing slash).

    Raises:
        CheckpointError: fsspec or the store's driver is missing, or the protocol is refused.
    """
    try:
        import fsspec  # noqa: PLC0415 -- an optional dependency (the "remote" extra)
    except ImportError as exc:
        raise CheckpointError(
            f"persistent tier {url!r} needs fsspec (the 'remote' extra of "
            "resiliency-checkpoint) and the store's driver: pip install fsspec s3fs (or gcsfs, "
            "adlfs)"
        ) from exc
    # A file system of our own, never fsspec's cached instance: that one is keyed by the
    # arguments only, so it would keep an endpoint or credentials read from the environment
    # when an earlier manager of this process opened the same URL.
    options = {"skip_instance_cache": True, **(storage_options or {})}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise CheckpointError(
            f"persistent tier {url!r}: fsspec cannot open it: {exc} (install the store's "
            "driver, e.g. s3fs for s3://, gcsfs for gs://)"
        ) from exc
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    for protocol in protocols:
        if protocol in _REFUSED:
            raise CheckpointError(
                f"persistent tier {url!r}: the {protocol}:// file system cannot hold a "
                f"checkpoint of several ranks: {_REFUSED[protocol]}"
            )
    return fs, str(path).rstrip("/")


def bounded(fn: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """Run one blocking store call under a deadline; raise ``RemoteStoreError`` naming it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # carried to the caller's thread, raised there
            box["error"] = exc

    thread = threading.Thread(target=run, name="ckpt-store-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        # The call cannot be interrupted; its thread is left to end on its own. What it may
        # still write carries a nonce nobody will commit.
        raise RemoteStoreError(f"{what}: no answer from the store within {timeout_s:g} s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, FileNotFoundError):
            raise error
        raise RemoteStoreError(f"{what}: {type(error).__name__}: {error}") from error
    return box["value"]


class RemoteRoot:
    """The checkpoint root at an fsspec URL (see the module docstring).

    Args:
        url: the root URL, e.g. ``s3://bucket/ckpt``.
        storage_options: keyword arguments for the fsspec file system.
        timeout_s: deadline of each single call into the store.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.fs, self.path = open_filesystem(url, storage_options)
        self.timeout_s = timeout_s

    def step_path(self, step: int) -> str:
        return f"{self.path}/step_{step:09d}"

    def step_url(self, step: int) -> str:
        return f"{self.url}/step_{step:09d}"

    def _call(self, fn: Callable[[], _T], what: str) -> _T:
        return bounded(fn, self.timeout_s, what)

    # ------------------------------------------------------------------ listing
    def committed_steps(self) -> list[int]:
        """Steps whose manifest is in the store, ascending (a listing; loads verify)."""
        pattern = f"{self.path}/step_*/{_layout.MANIFEST}"
        self.fs.invalidate_cache()  # another rank's commit must show at once
        found = self._call(lambda: self.fs.glob(pattern), f"listing {self.url}")
        steps = []
        for entry in found:
            parts = str(entry).rstrip("/").split("/")
            match = _STEP_RE.match(parts[-2]) if len(parts) >= 2 else None
            if match:
                steps.append(int(match.group(1)))
        return sorted(set(steps))

    def is_committed(self, step: int) -> bool:
        path = f"{self.step_path(step)}/{_layout.MANIFEST}"
        self.fs.invalidate_cache()
        return bool(self._call(lambda: self.fs.exists(path), f"looking for {path}"))

    def _step_prefixes(self) -> list[int]:
        self.fs.invalidate_cache()
        try:
            entries = self._call(lambda: self.fs.ls(self.path, detail=False), f"listing {self.url}")
        except FileNotFoundError:
            return []
        steps = []
        for entry in entries:
            match = _STEP_RE.match(str(entry).rstrip("/").rsplit("/", 1)[-1])
            if match:
                steps.append(int(match.group(1)))
        return steps

    # ------------------------------------------------------------------ objects
    def upload(self, local: Path, step: int, name: str) -> None:
        """Upload one local file as ``step_<N>/<name>``."""
        remote = f"{self.step_path(step)}/{name}"
        self._call(lambda: self.fs.put_file(str(local), remote), f"uploading {local} to {remote}")

    def put_bytes(self, step: int, name: str, data: bytes) -> None:
        remote = f"{self.step_path(step)}/{name}"
        self._call(lambda: self.fs.pipe_file(remote, data), f"uploading {remote}")

    def download(self, step: int, name: str, local: Path) -> None:
        """Download ``step_<N>/<name>`` to ``local``; ``FileNotFoundError`` when it is absent."""
        remote = f"{self.step_path(step)}/{name}"
        self._call(lambda: self.fs.get_file(remote, str(local)), f"downloading {remote}")

    def read_manifest(self, step: int) -> dict[str, Any]:
        """The validated manifest of a committed step; ``ValueError`` naming what is wrong."""
        remote = f"{self.step_path(step)}/{_layout.MANIFEST}"
        try:
            raw = self._call(lambda: self.fs.cat_file(remote), f"reading {remote}")
            manifest = json.loads(raw)
        except FileNotFoundError:
            raise ValueError(f"{remote}: missing") from None
        except (RemoteStoreError, ValueError) as exc:
            raise ValueError(f"{remote}: unreadable ({exc})") from None
        return _layout.check_manifest(manifest, remote)

    # ------------------------------------------------------------------ deletes
    def remove_step(self, step: int) -> None:
        """Delete a step: its manifest first (it is then no longer committed), then the rest."""
        prefix = self.step_path(step)
        manifest = f"{prefix}/{_layout.MANIFEST}"
        with contextlib.suppress(FileNotFoundError):  # already deleted: nothing to undo
            self._call(lambda: self.fs.rm_file(manifest), f"deleting {manifest}")
        self.remove_files(step, None)

    def remove_files(self, step: int, nonce: str | None) -> None:
        """Delete an uncommitted attempt's files (those naming ``nonce``; None: all of them)."""
        prefix = self.step_path(step)
        try:
            names = self._call(lambda: self.fs.ls(prefix, detail=False), f"listing {prefix}")
        except FileNotFoundError:
            return
        doomed = [str(n) for n in names if nonce is None or f"_{nonce}_" in str(n).rsplit("/")[-1]]
        if doomed:
            self._call(lambda: self.fs.rm(doomed), f"deleting {len(doomed)} objects under {prefix}")

    def apply_retention(self, keep_last: int | None, keep_every: int | None) -> list[int]:
        """Delete committed steps beyond ``keep_last`` that ``keep_every`` does not keep."""
        doomed = _layout.retention_victims(self.committed_steps(), keep_last, keep_every)
        for step in doomed:
            self.remove_step(step)
        if doomed:
            logger.info("retention removed steps %s under %s", doomed, self.url)
        return doomed

    def remove_uncommitted(self) -> None:
        """Delete step prefixes that hold no manifest (attempts of an earlier job that failed)."""
        committed = set(self.committed_steps())
        for step in self._step_prefixes():
            if step not in committed:
                logger.info("removing %s: a save never committed", self.step_url(step))
                self.remove_files(step, None)
