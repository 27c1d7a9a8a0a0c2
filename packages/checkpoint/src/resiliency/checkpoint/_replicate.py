"""Copy shard directories between ranks over ``torch.distributed`` (send/recv of byte tensors).

One exchange moves any number of directories at once: each rank posts its sends and receives
together, so a ring of peers (rank r to the next node, from the previous one) moves in parallel.
A transfer is a header (the shard's manifest as JSON, or ``{"ok": false}`` when the sender has
nothing valid), then every file of the manifest in fixed-size chunks. The receiver writes into
a temporary directory, checks each file's size and CRC-32 against the header, fsyncs, and only
then writes the manifest: a received copy is verified before anybody may commit it.

Every wait is bounded (``timeout_s`` for the whole exchange) and a failure names the peer: a
dead or silent peer becomes a ``ReplicationError``, never an endless wait. On a NCCL group the
chunks go through the GPU (``device``); on gloo they stay on the CPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import _layout

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


def _pump(  # noqa: PLR0917
    link: _Link,
    outgoing: list[Outgoing],
    sends: list[list[tuple[str, int, int]]],
    incoming: list[Incoming],
    plans: list[list[tuple[str, int, int]]],
    peer_node: Any,
) -> int:
    """Move every chunk: round k posts chunk k of every transfer; while it is on the wire the
    chunks of round k-1 are written and checksummed (two rounds in flight at most)."""
    readers: dict[tuple[int, str], Any] = {}
    writers: dict[tuple[int, str], Any] = {}
    sent = 0
    # Two buffers per transfer, reused by alternate rounds: a round's buffers are free again
    # once the round after it has landed. Fresh 32 MiB buffers per chunk cost a page fault per
    # 4 KiB, which made the transfer memory-bound.
    out_bufs = [[torch.empty(0, dtype=torch.uint8)] * 2 for _ in outgoing]
    in_bufs = [[torch.empty(0, dtype=torch.uint8)] * 2 for _ in incoming]

    def buffer(pool: list[torch.Tensor], k: int, nbytes: int) -> torch.Tensor:
        if pool[k % 2].numel() < nbytes:
            pool[k % 2] = torch.empty(max(nbytes, CHUNK_BYTES), dtype=torch.uint8)
        return pool[k % 2][:nbytes]

    def land(works: list[Any], received: list[tuple[int, Incoming, str, torch.Tensor]]) -> None:
        link.wait(peer_node, works)
        for n, i, name, buf in received:
            if i.error:  # a local write already failed: keep receiving, drop the bytes
                continue
            data = memoryview(buf.cpu().numpy())  # type: ignore[arg-type]
            try:
                writer = writers.get((n, name))
                if writer is None:
                    writer = writers[(n, name)] = open(i.directory / name, "wb")  # noqa: SIM115
                writer.write(data)
            except OSError as exc:  # e.g. disk full: the protocol goes on, the copy is failed
                i.error = f"writing the copy received from rank {i.src} failed: {exc}"
                continue
            i._crc[name] = zlib.crc32(data, i._crc.get(name, 0))
            i.bytes += len(data)

    try:
        rounds = max([len(s) for s in sends] + [len(p) for p in plans] + [0])
        previous: tuple[list[Any], list[Any]] | None = None
        for k in range(rounds):
            received = []
            for n, (o, chunks) in enumerate(zip(outgoing, sends, strict=True)):
                if k >= len(chunks):
                    continue
                name, _, nbytes = chunks[k]
                buf = buffer(out_bufs[n], k, nbytes)
                view = memoryview(buf.numpy())  # type: ignore[arg-type]
                try:  # a short or unreadable file sends zeros: the receiver's CRC check fails
                    reader = readers.get((n, name))
                    if reader is None:
                        reader = readers[(n, name)] = open(o.directory / name, "rb")  # noqa: SIM115
                    got = reader.readinto(view)
                except OSError as exc:
                    got = -1
                    logger.warning("%s: %s", o.directory / name, exc)
                if got != nbytes:
                    buf[max(got, 0) :] = 0
                    logger.warning("%s is shorter than its manifest", o.directory / name)
                link.send(buf, o.dst)
                sent += nbytes
            for n, (i, chunks) in enumerate(zip(incoming, plans, strict=True)):
                if k < len(chunks):
                    name, _, nbytes = chunks[k]
                    buf = link.recv(buffer(in_bufs[n], k, nbytes), i.src)
                    received.append((n, i, name, buf))
            current = (link.take(), received)
            if previous is not None:
                land(*previous)
            previous = current
        if previous is not None:
            land(*previous)
    finally:
        for f in readers.values():
            f.close()
        for f in writers.values():
            try:
                f.flush()
                _fsync(f)
            except OSError as exc:
                logger.error("%s: %s", f.name, exc)
                for i in incoming:
                    if Path(f.name).parent == i.directory and not i.error:
                        i.error = f"flushing {f.name} failed: {exc}"
            finally:
                with contextlib.suppress(OSError):
                    f.close()
    return sent


def _fsync(f: Any) -> None:
    os.fsync(f.fileno())


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
