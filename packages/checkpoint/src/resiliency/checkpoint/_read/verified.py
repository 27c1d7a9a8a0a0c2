"""Load a shard directory in one pass: each byte read once, into its tensor, checked on the way.

DCP's ``FileSystemReader`` reads each tensor through ``torch.load`` into a fresh tensor and then
copies it into the target; a separate CRC pass before it reads every file once more. On a
memory-bound host that is three passes over the state and a fresh allocation of all of it. Here
every file of the manifest is read front to back exactly once: the raw bytes of a tensor go
straight into the target tensor's memory, everything else (zip headers, pickled objects) into a
scratch buffer, and the running CRC-32 covers all of it, so the file is verified in the same
pass.

A tensor takes the direct path when its target is a contiguous CPU tensor of the stored dtype
and the read covers the whole stored chunk. The stored record is then one uncompressed zip
entry of exactly the target's bytes, in row-major order: the toolkit's writer only ever saves
tensors built over its staging arena with ``torch.frombuffer(...).view(shape)`` (contiguous,
storage exactly its own bytes), which ``torch.save`` stores as they lie. Every other item
(objects, narrowed or converted reads, extension transforms) is read into memory during the
same pass and handed to DCP's own logic after its file has verified.

A checksum mismatch can leave the tensors already read partly overwritten; the caller treats
the whole load as failed and loads another copy into the same state (see ``_tiers.restore``).

This is the one read path of the package; where the files are and who checks which file are
its options (:func:`load_verified`):

- a node-local shard directory (the local tier): every file of the manifest is checked;
- a step on a shared file system (``_engine.restore``): only the files this rank's load plan
  reads (``only_what_it_reads``), since the step was agreed on after every file's size and a
  share of the checksums were verified by every rank;
- an object store (``_remote.read``): each file is first brought into a spool directory
  (``fetch``), and only the files this rank reads are fetched and checked.
"""

from __future__ import annotations

import ctypes
import io
import itertools
import os
import re
import struct
import sys
import warnings
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from resiliency.checkpoint import _layout

_CHUNK = 4 << 20  # CRC-32 each piece while it is still in the CPU's cache
_STORAGE_RECORD = re.compile(r"(^|/)data/\d+$")
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_DCP_NO_DIST_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


class CorruptShardError(Exception):
    """A file of the shard does not match its manifest (size or CRC-32)."""


@dataclass
class _Region:
    """A byte range of one file and where it goes: a tensor's memory, or a kept buffer."""

    start: int
    end: int
    dest: memoryview
    req: ReadItem | None = None  # set for an item handed to DCP's logic after the check


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``[start, start + length)`` of an open file."""

    def __init__(self, fh: io.FileIO, start: int, length: int) -> None:
        super().__init__()
        self._fh, self._start, self._length, self._pos = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, min(self._length, base + offset))
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        left = self._length - self._pos
        n = left if n is None or n < 0 else min(n, left)
        self._fh.seek(self._start + self._pos)
        data = self._fh.read(n)
        self._pos += len(data)
        return data


def _narrow(t: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    """The part of ``t`` a read item asks for (what DCP's reader does with it)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        if int(offset) != 0 or int(length) != t.size(dim):
            t = t.narrow(dim, int(offset), int(length))
    return t


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The memory of a contiguous CPU tensor as a writable byte view (any dtype)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _storage_entry(fh: io.FileIO, start: int, length: int) -> zipfile.ZipInfo | None:
    """The one uncompressed storage record of a ``torch.save`` item, or None if unusual."""
    try:
        with zipfile.ZipFile(_Window(fh, start, length)) as zf:
            records = [i for i in zf.infolist() if _STORAGE_RECORD.search(i.filename)]
            order = [i for i in zf.infolist() if i.filename.endswith("/byteorder")]
        # Read past zipfile, which checks each record's CRC-32: the writer does not compute
        # them (the manifest's CRC-32 covers the whole file, checked in the same pass).
        if order and _stored_bytes(fh, start, order[0]) != sys.byteorder.encode():
            return None
    except (zipfile.BadZipFile, OSError, ValueError, KeyError):
        return None  # the CRC pass reports a damaged file; DCP's path reports the rest
    if len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED:
        return None
    return records[0]


def _data_offset(fh: io.FileIO, start: int, record: zipfile.ZipInfo) -> int | None:
    """Where the data of a zip ``record`` of the item at ``start`` begins in the file."""
    fh.seek(start + record.header_offset)
    header = fh.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        return None
    fields = _LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[-2], fields[-1]
    return start + record.header_offset + _LOCAL_HEADER.size + name_len + extra_len


def _stored_bytes(fh: io.FileIO, start: int, record: zipfile.ZipInfo) -> bytes | None:
    """The bytes of an uncompressed zip ``record``, read without checking its CRC-32."""
    at = _data_offset(fh, start, record)
    if at is None or record.compress_type != zipfile.ZIP_STORED:
        return None
    fh.seek(at)
    return fh.read(record.file_size)


def _raw_record(fh: io.FileIO, start: int, length: int, nbytes: int) -> int | None:
    """Where the raw bytes of an item's tensor start in the file, or None if unusual."""
    record = _storage_entry(fh, start, length)
    if record is None or record.file_size != nbytes:
        return None
    return _data_offset(fh, start, record)


Fetch = Callable[[str, Path], None]  # (file name, where to put it): raises CorruptShardError


class VerifyingReader(FileSystemReader):
    """DCP's file-system reader, reading each file once and checking it against ``files``.

    Args:
        path: the directory the files are read from.
        files: the manifest's entries (name -> size and checksum).
        fetch: brings a file into ``path`` before it is first read (None: already there).
        only_what_it_reads: check only the files the load plan reads (and ``.metadata``).
    """

    def __init__(
        self,
        path: Path,
        files: dict[str, dict[str, Any]],
        *,
        fetch: Fetch | None = None,
        only_what_it_reads: bool = False,
    ) -> None:
        super().__init__(path)
        self._dir = Path(path)
        self._files = files
        self._fetch, self._only_what_it_reads = fetch, only_what_it_reads
        self._present: set[str] = set()
        self._checked: set[str] = set()
        self.direct_bytes = 0  # tensor bytes read straight into their targets

    def _bring(self, name: str) -> None:
        if self._fetch is not None and name not in self._present:
            if name not in self._files:
                raise CorruptShardError(f"{self._dir / name}: not in the manifest")
            self._fetch(name, self._dir / name)
            self._present.add(name)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        if self._only_what_it_reads:  # the other files are other ranks' to check
            self._files = {
                n: e for n, e in self._files.items() if n in per_file or n == ".metadata"
            }
        if any(self.storage_data[r.storage_index].transform_descriptors for r in plan.items):
            # Extension transforms (compression...): check every file, then DCP's own reads.
            for name in self._files:
                if name not in self._checked:
                    self.check_whole(name)
            return super().read_data(plan, planner)
        for name, reqs in per_file.items():
            self._read_file(name, reqs, planner)
        for name in self._files:
            if name not in self._checked:
                self.check_whole(name)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    # -- one file -------------------------------------------------------------------------------
    def _expected(self, name: str) -> tuple[int, str]:
        entry = self._files.get(name)
        if entry is None:
            raise CorruptShardError(f"{self._dir / name}: not in the manifest")
        return int(entry["size"]), str(entry[_layout.CHECKSUM])

    def check_whole(self, name: str) -> None:
        """Check one whole file of the manifest (one read)."""
        size, crc = self._expected(name)
        self._bring(name)
        path = self._dir / name
        try:
            got_size, got_crc = _layout.file_checksum(path)
        except OSError as exc:
            raise CorruptShardError(f"{path}: unreadable ({exc})") from exc
        self._compare(path, size, crc, got_size, got_crc)
        self._checked.add(name)

    @staticmethod
    def _compare(path: Path, size: int, crc: str, got_size: int, got_crc: str) -> None:
        if got_size != size:
            raise CorruptShardError(f"{path}: size {got_size} != {size} in the manifest (torn)")
        if got_crc != crc:
            raise CorruptShardError(f"{path}: {_layout.CHECKSUM} {got_crc} != {crc} (corrupt)")

    def _direct_target(self, req: ReadItem, planner: LoadPlanner) -> torch.Tensor | None:
        if req.type != LoadItemType.TENSOR or any(int(o) for o in req.storage_offsets):
            return None
        md = self._metadata.state_dict_metadata.get(req.storage_index.fqn)
        if not isinstance(md, TensorStorageMetadata):
            return None
        chunk = next(
            (c for c in md.chunks if tuple(c.offsets) == tuple(req.storage_index.offset or ())),
            None,
        )
        if chunk is None or tuple(chunk.sizes) != tuple(req.lengths):
            return None
        target = planner.resolve_tensor(req).detach()
        if (
            target.device.type != "cpu"
            or not target.is_contiguous()
            or target.dtype != md.properties.dtype
            or tuple(target.shape) != tuple(req.lengths)
        ):
            return None
        return target

    def _read_file(self, name: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        size, crc = self._expected(name)
        self._bring(name)
        path = self._dir / name
        try:
            fh = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below, on every path)
        except OSError as exc:
            raise CorruptShardError(f"{path}: unreadable ({exc})") from exc
        with fh:
            actual = os.fstat(fh.fileno()).st_size
            if actual != size:
                raise CorruptShardError(f"{path}: size {actual} != {size} in the manifest (torn)")
            regions, direct = self._plan_regions(fh, reqs, planner, size)
            got_crc = self._pass(fh, regions, size, path)
        self._compare(path, size, crc, size, got_crc)
        self._checked.add(name)
        for region in regions:
            if region.req is not None:
                self._apply(region.req, region.dest, planner)
        for req, target in direct:
            planner.commit_tensor(req, target)
            self.direct_bytes += target.numel() * target.element_size()

    def _plan_regions(
        self, fh: io.FileIO, reqs: list[ReadItem], planner: LoadPlanner, size: int
    ) -> tuple[list[_Region], list[tuple[ReadItem, torch.Tensor]]]:
        regions: list[_Region] = []
        direct: list[tuple[ReadItem, torch.Tensor]] = []
        for req in reqs:
            info = self.storage_data[req.storage_index]
            if info.offset < 0 or info.offset + info.length > size:
                raise CorruptShardError(
                    f"{self._dir / info.relative_path}: item {req.storage_index.fqn} lies "
                    "outside the file"
                )
            target = self._direct_target(req, planner)
            nbytes = target.numel() * target.element_size() if target is not None else 0
            at = _raw_record(fh, info.offset, info.length, nbytes) if target is not None else None
            if target is not None and at is not None and nbytes > 0:
                regions.append(_Region(at, at + nbytes, _tensor_bytes(target)))
                direct.append((req, target))
            else:
                buf = memoryview(bytearray(info.length))
                regions.append(_Region(info.offset, info.offset + info.length, buf, req))
        regions.sort(key=lambda r: r.start)
        for a, b in itertools.pairwise(regions):
            if b.start < a.end:
                raise CorruptShardError(f"{self._dir}: overlapping items in the metadata")
        return regions, direct

    @staticmethod
    def _pass(fh: io.FileIO, regions: list[_Region], size: int, path: Path) -> str:
        """Read the file once, front to back, into the regions; return its CRC-32 (hex)."""
        crc = 0
        scratch = memoryview(bytearray(_CHUNK))
        fh.seek(0)
        pos = 0

        def fill(dest: memoryview, n: int) -> None:
            nonlocal crc, pos
            done = 0
            while done < n:
                piece = dest[done : min(n, done + _CHUNK)]
                got = fh.readinto(piece)
                if not got:
                    raise CorruptShardError(f"{path}: ends early at byte {pos + done}")
                crc = zlib.crc32(piece[:got], crc)
                done += got
            pos += n

        def skip_to(end: int) -> None:
            while pos < end:
                fill(scratch, min(_CHUNK, end - pos))

        for region in regions:
            skip_to(region.start)
            fill(region.dest, region.end - region.start)
        skip_to(size)
        return f"{crc & 0xFFFFFFFF:08x}"

    @staticmethod
    def _apply(req: ReadItem, data: memoryview, planner: LoadPlanner) -> None:
        """DCP's own handling of one item, from bytes already read and verified."""
        stream = io.BytesIO(data)
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, stream)
            return
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        tensor = _narrow(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"{req.storage_index.fqn}: stored size {tuple(tensor.size())} != "
                f"{tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)


def load_verified(
    state: dict[str, Any],
    directory: Path,
    *,
    files: dict[str, dict[str, Any]] | None = None,
    fetch: Fetch | None = None,
    only_what_it_reads: bool = False,
) -> int:
    """Load the DCP checkpoint in ``directory`` into ``state``, verifying what it reads.

    Args:
        state: the state to load into (DCP's rules).
        directory: where the files are (or where ``fetch`` puts them).
        files: the manifest's entries (default: ``directory``'s ``manifest.json``).
        fetch: brings each file into ``directory`` before it is first read.
        only_what_it_reads: check only the files this rank's load plan reads; otherwise
            every file of the manifest is checked (a shard only this rank loads).

    Returns:
        The tensor bytes read straight into ``state``.

    Raises:
        CorruptShardError: the manifest is unreadable, or a file is missing, torn or corrupt.
        CheckpointException: DCP's error when ``state`` does not match the checkpoint.
    """
    if files is None:
        try:
            files = _layout.read_manifest(directory)["files"]
        except ValueError as exc:
            raise CorruptShardError(str(exc)) from exc
    reader = VerifyingReader(directory, files, fetch=fetch, only_what_it_reads=only_what_it_reads)
    # Before DCP unpickles the metadata (DCP would also turn the error into a string).
    for name in files:
        if not name.endswith(".distcp"):
            reader.check_whole(name)
    try:
        with warnings.catch_warnings():
            # torch 2.x warns that it "assumes the intent is to load in a single process" even
            # when no_dist=True says so: every user restore would print it once per rank.
            warnings.filterwarnings("ignore", _DCP_NO_DIST_WARNING, UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as exc:
        corrupt = corruption_in(exc)
        if corrupt is not None:
            raise corrupt from exc
        raise
    return reader.direct_bytes


def corruption_in(exc: BaseException) -> CorruptShardError | None:
    """DCP wraps a reader's exception (``CheckpointException``); find ours inside it."""
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CorruptShardError):
            return e
        if isinstance(e, CheckpointException):  # rank -> (exception, traceback)
            stack.extend(pair[0] for pair in e.failures.values())
        stack.extend([e.__cause__, e.__context__])
    return None
