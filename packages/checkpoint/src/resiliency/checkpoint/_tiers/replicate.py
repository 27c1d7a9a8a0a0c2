"""Copy shard directories between ranks over ``torch.distributed`` (send/recv of byte tensors).

One exchange moves any number of directories at once: each rank posts its sends and receives
together, so a ring of peers (rank r to the next node, from the previous one) moves in parallel.
A transfer is a header (the shard's manifest as JSON, or ``{"ok": false}`` when the sender has
nothing valid), then every file of the manifest in fixed-size chunks, sent straight from a map of
the file and received straight into a map of its copy (no buffer in between). The receiver
writes into a temporary directory, checks each file's size and CRC-32 against the header,
fsyncs, and only then writes the manifest: a received copy is verified before anybody may commit
it.

Every wait is bounded (``timeout_s`` for the whole exchange) and a failure names the peer: a
dead or silent peer becomes a ``ReplicationError``, never an endless wait. On a NCCL group the
chunks go through the GPU (``device``); on gloo they stay on the CPU.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from resiliency.checkpoint import _layout

logger = logging.getLogger(__name__)

CHUNK_BYTES = 32 << 20
_MAX_HEADER = 16 << 20


class ReplicationError(RuntimeError):
    """A transfer between two ranks failed or timed out (the message names the peer)."""


@dataclass
class Outgoing:
    """Send the files of ``manifest`` (or a refusal when None) from ``directory`` to ``dst``."""

    dst: int
    directory: Path
    manifest: dict[str, Any] | None


@dataclass
class Incoming:
    """Receive one directory from ``src`` into ``directory`` (created here)."""

    src: int
    directory: Path
    manifest: dict[str, Any] | None = None  # the received header, once verified
    error: str = ""
    bytes: int = 0
    _crc: dict[str, int] = field(default_factory=dict)


def _chunks(manifest: dict[str, Any] | None) -> list[tuple[str, int, int]]:
    """``(file, offset, nbytes)`` of every chunk, in a fixed order."""
    out: list[tuple[str, int, int]] = []
    if not manifest:
        return out
    for name in sorted(manifest["files"]):
        size = int(manifest["files"][name]["size"])
        for offset in range(0, size, CHUNK_BYTES):
            out.append((name, offset, min(CHUNK_BYTES, size - offset)))
    return out


class _Link:
    """Bounded point-to-point operations on one group; errors name the peer."""

    def __init__(self, group: dist.ProcessGroup, deadline: float, what: str, device: Any) -> None:
        self.group = group
        self.deadline = deadline
        self.what = what
        self.device = device
        self.pending: list[tuple[Any, int, str]] = []

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        if self.device is not None:
            tensor = tensor.to(self.device)
        work = dist.isend(tensor, self._global(dst), group=self.group)
        self.pending.append((work, dst, "sending to"))

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        buf = tensor.to(self.device) if self.device is not None else tensor
        work = dist.irecv(buf, self._global(src), group=self.group)
        self.pending.append((work, src, "receiving from"))
        return buf

    def take(self) -> list[tuple[Any, int, str]]:
        pending, self.pending = self.pending, []
        return pending

    def wait(self, peer_node: Any, pending: list[tuple[Any, int, str]] | None = None) -> None:
        for work, peer, verb in self.take() if pending is None else pending:
            left = self.deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("deadline passed")
                work.wait(timedelta(seconds=left))
            except Exception as exc:
                raise ReplicationError(
                    f"{self.what}: {verb} rank {peer} (node {peer_node(peer)}) failed or timed "
                    f"out: {exc}"
                ) from exc


def exchange(
    group: dist.ProcessGroup,
    outgoing: list[Outgoing],
    incoming: list[Incoming],
    *,
    timeout_s: float,
    what: str,
    peer_node: Any = str,
    device: Any = None,
) -> int:
    """Run one collective exchange (every rank calls it with matching lists); return bytes sent.

    Receive failures of a well-formed transfer (bad CRC, refused) are recorded in the
    ``Incoming``; a dead or silent peer raises ``ReplicationError``.
    """
    release_abandoned()
    link = _Link(group, time.monotonic() + timeout_s, what, device)
    headers = [
        json.dumps(o.manifest if o.manifest is not None else {"ok": False}).encode()
        for o in outgoing
    ]
    for o, h in zip(outgoing, headers, strict=True):
        link.send(torch.tensor([len(h)], dtype=torch.int64), o.dst)
    lengths = [link.recv(torch.zeros(1, dtype=torch.int64), i.src) for i in incoming]
    link.wait(peer_node)
    for o, h in zip(outgoing, headers, strict=True):
        link.send(torch.frombuffer(bytearray(h), dtype=torch.uint8), o.dst)
    raw = []
    for i, n in zip(incoming, lengths, strict=True):
        size = int(n.cpu().item())
        if not 0 < size <= _MAX_HEADER:
            raise ReplicationError(f"{what}: rank {i.src} sent a header of {size} bytes")
        raw.append(link.recv(torch.empty(size, dtype=torch.uint8), i.src))
    link.wait(peer_node)
    plans: list[list[tuple[str, int, int]]] = []
    for i, buf in zip(incoming, raw, strict=True):
        try:
            header = json.loads(bytes(buf.cpu().numpy().tobytes()))
        except ValueError:
            header = None
        if not isinstance(header, dict) or not isinstance(header.get("files"), dict):
            i.error = f"rank {i.src} had no valid copy to send"
            plans.append([])
            continue
        i.manifest = header
        try:
            i.directory.mkdir(parents=True, exist_ok=False)
        except OSError as exc:  # the chunks are still received (and dropped)
            i.error = f"cannot create {i.directory}: {exc}"
        plans.append(_chunks(header))
    sends = [_chunks(o.manifest) for o in outgoing]
    sent = _pump(link, outgoing, sends, incoming, plans, peer_node)
    for i in incoming:
        if i.manifest is not None and not i.error:
            _finish(i)
    return sent


class _Maps:
    """The memory maps of one exchange's files, and the operations posted on them.

    The chunks go straight between the files' pages and the wire: a sent chunk is a view of
    the source file's map, a received one lands in the target file's map (allocated up front,
    so a full disk is an ``OSError`` there, never a ``SIGBUS`` on a write). That spares the copy
    through a buffer on each side.
    """

    def __init__(self) -> None:
        self.sources: dict[tuple[int, str], mmap.mmap | None] = {}
        self.targets: dict[tuple[int, str], tuple[int, mmap.mmap]] = {}
        self.posted: list[Any] = []

    def source(self, n: int, path: Path, size: int) -> mmap.mmap | None:
        """A private map of the first ``size`` bytes of ``path``; None if it has fewer."""
        if (n, path.name) not in self.sources:
            self.sources[(n, path.name)] = _map_source(path, size)
        return self.sources[(n, path.name)]

    def target(self, n: int, path: Path, size: int) -> mmap.mmap:
        """A shared map of ``path``, created with ``size`` bytes allocated; raises ``OSError``."""
        if (n, path.name) not in self.targets:
            self.targets[(n, path.name)] = _map_target(path, size)
        return self.targets[(n, path.name)][1]

    def flush(self, incoming: list[Incoming]) -> None:
        """Every operation has landed: write the received files through, unmap everything."""
        for (n, name), (fd, target) in self.targets.items():
            i = incoming[n]
            try:
                if not i.error:
                    target.flush()
                    os.fsync(fd)
            except OSError as exc:
                logger.error("%s: %s", i.directory / name, exc)
                i.error = f"flushing {i.directory / name} failed: {exc}"
            finally:
                target.close()
                os.close(fd)
        for source in self.sources.values():
            if source is not None:
                source.close()

    def abandon(self) -> None:
        """The exchange failed: gloo may still read or write these pages, so they stay mapped
        until every operation posted on them has ended (``release_abandoned``)."""
        maps: list[mmap.mmap] = [m for m in self.sources.values() if m is not None]
        for fd, target in self.targets.values():
            os.close(fd)  # the map stays valid without its descriptor
            maps.append(target)
        with _ABANDONED_LOCK:
            _ABANDONED.append((self.posted, maps))


_ABANDONED: list[tuple[list[Any], list[mmap.mmap]]] = []
_ABANDONED_LOCK = threading.Lock()


def release_abandoned() -> None:
    """Unmap the maps of failed exchanges whose operations have all ended."""
    with _ABANDONED_LOCK:
        keep = []
        for works, maps in _ABANDONED:
            if all(w.is_completed() for w in works):
                for m in maps:
                    m.close()
            else:
                keep.append((works, maps))
        _ABANDONED[:] = keep


def _map_source(path: Path, size: int) -> mmap.mmap | None:
    try:
        with open(path, "rb") as f:
            have = os.fstat(f.fileno()).st_size
            if have < size:
                logger.warning(
                    "%s has %d bytes, its manifest says %d: the copy sent will not verify",
                    path,
                    have,
                    size,
                )
                return None
            # Private and writable only because torch wants a writable buffer; nothing writes.
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        logger.warning("%s cannot be read (%s): the copy sent will not verify", path, exc)
        return None


def _map_target(path: Path, size: int) -> tuple[int, mmap.mmap]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def _pump(  # noqa: PLR0917
    link: _Link,
    outgoing: list[Outgoing],
    sends: list[list[tuple[str, int, int]]],
    incoming: list[Incoming],
    plans: list[list[tuple[str, int, int]]],
    peer_node: Any,
) -> int:
    """Move every chunk: round k posts chunk k of every transfer; while it is on the wire the
    chunks of round k-1 are checksummed (two rounds in flight at most)."""
    maps = _Maps()
    sent = 0
    # A chunk with nowhere to come from or go to (unreadable source, failed target) still
    # moves, so that both ends stay in step: zeros are sent, received bytes are dropped into
    # one of two scratch buffers per transfer (a round's buffer is free again once the round
    # after it has landed).
    zeros = torch.zeros(0, dtype=torch.uint8)
    scratch = [[torch.empty(0, dtype=torch.uint8)] * 2 for _ in incoming]

    def drop(n: int, k: int, nbytes: int) -> torch.Tensor:
        if scratch[n][k % 2].numel() < nbytes:
            scratch[n][k % 2] = torch.empty(max(nbytes, CHUNK_BYTES), dtype=torch.uint8)
        return scratch[n][k % 2][:nbytes]

    def land(works: list[Any], received: list[tuple[Incoming, str, Any, Any]]) -> None:
        link.wait(peer_node, works)
        for i, name, view, buf in received:
            if i.error or view is None:  # a local write failed: the bytes are dropped
                continue
            if buf is not view:  # NCCL: the chunk landed on the device
                view.copy_(buf.cpu())
            i._crc[name] = zlib.crc32(view.numpy(), i._crc.get(name, 0))
            i.bytes += view.numel()

    ok = False
    try:
        rounds = max([len(s) for s in sends] + [len(p) for p in plans] + [0])
        previous: tuple[list[Any], list[Any]] | None = None
        for k in range(rounds):
            for n, (o, chunks) in enumerate(zip(outgoing, sends, strict=True)):
                if k >= len(chunks):
                    continue
                name, offset, nbytes = chunks[k]
                assert o.manifest is not None
                size = int(o.manifest["files"][name]["size"])
                source = maps.source(n, o.directory / name, size)
                if source is None:
                    if zeros.numel() < nbytes:
                        zeros = torch.zeros(max(nbytes, CHUNK_BYTES), dtype=torch.uint8)
                    link.send(zeros[:nbytes], o.dst)
                else:
                    link.send(_view(source, offset, nbytes), o.dst)
                sent += nbytes
            received = []
            for n, (i, chunks) in enumerate(zip(incoming, plans, strict=True)):
                if k >= len(chunks):
                    continue
                name, offset, nbytes = chunks[k]
                view = None
                if not i.error:
                    assert i.manifest is not None
                    try:
                        size = int(i.manifest["files"][name]["size"])
                        view = _view(maps.target(n, i.directory / name, size), offset, nbytes)
                    except OSError as exc:  # e.g. disk full: the protocol goes on, the copy fails
                        i.error = f"writing the copy received from rank {i.src} failed: {exc}"
                buf = link.recv(view if view is not None else drop(n, k, nbytes), i.src)
                received.append((i, name, view, buf))
            current = (link.take(), received)
            maps.posted.extend(current[0])
            if previous is not None:
                land(*previous)
            previous = current
        if previous is not None:
            land(*previous)
        ok = True
    finally:
        if ok:
            maps.flush(incoming)
        else:
            maps.abandon()
    return sent


def _view(mapping: mmap.mmap, offset: int, nbytes: int) -> torch.Tensor:
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset)


def _finish(i: Incoming) -> None:
    """Verify a received directory against its header, then write its manifest (durably)."""
    assert i.manifest is not None
    for name, entry in i.manifest["files"].items():
        path = i.directory / name
        if int(entry["size"]) == 0:
            path.touch()
        crc = f"{i._crc.get(name, 0) & 0xFFFFFFFF:08x}"
        if crc != entry[_layout.CHECKSUM]:
            i.error = (
                f"the copy of {name} received from rank {i.src} has {_layout.CHECKSUM} {crc}, "
                f"its manifest says {entry[_layout.CHECKSUM]} (corrupt copy)"
            )
            return
    _layout.write_durable(i.directory / _layout.MANIFEST, json.dumps(i.manifest, indent=1).encode())
    _layout.fsync_dir(i.directory)
