"""Staging buffers: one shared-memory arena per rank, allocated once and reused across saves.

The arena is an anonymous shared-memory file (``memfd_create``; no name in /dev/shm that could
leak) mapped in the rank and, through its file descriptor, in the writer process. A save copies
each tensor (and each small serialized object) into its slot; the layout is recomputed per save
(a few microseconds) and the arena grows only when the state no longer fits. For CUDA tensors
the arena is registered as pinned host memory (``cudaHostRegister``), so device-to-host copies
run at full speed straight into shared memory, with one stream synchronization at the end.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

ALIGN = 64


def align(n: int) -> int:
    """Round ``n`` up to the arena's alignment."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _anonymous_fd(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("resiliency-ckpt-arena", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        handle, path = tempfile.mkstemp(prefix="resiliency-ckpt-arena-", dir="/dev/shm")
        os.unlink(path)
        fd = handle
    os.ftruncate(fd, size)
    return fd


@dataclass
class Slot:
    """Where one staged value lies in the arena."""

    offset: int
    nbytes: int


class Arena:
    """A growable shared-memory staging area; ``fd`` is what the writer maps."""

    def __init__(self) -> None:
        self.fd = -1
        self.size = 0
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None
        self._pinned = False
        self.generation = 0

    def ensure(self, size: int) -> bool:
        """Make the arena hold ``size`` bytes; return True when it was (re)allocated."""
        if size <= self.size and self._map is not None:
            return False
        new_size = max(align(size), 1 << 20)
        self.close()
        self.fd = _anonymous_fd(new_size)
        self._map = mmap.mmap(self.fd, new_size, flags=mmap.MAP_SHARED)
        self.size = new_size
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self.generation += 1
        logger.debug("staging arena of %d bytes allocated", new_size)
        return True

    @property
    def mapping(self) -> mmap.mmap:
        """The arena's memory (what a writer process maps from ``fd``)."""
        assert self._map is not None, "the arena is empty"
        return self._map

    def pin(self) -> None:
        """Register the arena as pinned host memory for CUDA copies (once per allocation)."""
        if self._pinned or self._bytes is None or not torch.cuda.is_available():
            return
        ptr = self._bytes.data_ptr()
        err = torch.cuda.cudart().cudaHostRegister(ptr, self.size, 0)
        if int(err) != 0:
            logger.warning("cudaHostRegister of the staging arena failed (%s)", err)
            return
        self._pinned = True

    def view(self, slot: Slot, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
        """Return the staged tensor of ``slot``."""
        assert self._bytes is not None
        raw = self._bytes[slot.offset : slot.offset + slot.nbytes]
        return raw.view(dtype).view(shape)

    def write_bytes(self, slot: Slot, data: bytes) -> None:
        assert self._map is not None
        self._map[slot.offset : slot.offset + len(data)] = data

    def close(self) -> None:
        if self._pinned and self._bytes is not None:
            torch.cuda.cudart().cudaHostUnregister(self._bytes.data_ptr())
            self._pinned = False
        self._bytes = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive; the mapping goes with it
                logger.debug("staging arena still referenced at close")
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.size = 0


def layout(values: list[Any]) -> tuple[list[Slot], int]:
    """Place each value (a tensor or bytes) at an aligned offset; return slots and total size."""
    slots = []
    offset = 0
    for value in values:
        nbytes = (
            value.numel() * value.element_size() if isinstance(value, torch.Tensor) else len(value)
        )
        slots.append(Slot(offset, nbytes))
        offset += align(max(nbytes, 1))
    return slots, offset


def stage(
    arena: Arena, values: list[Any], slots: list[Slot], views: list[Any] | None = None
) -> None:
    """Copy every value into its slot (``views``: the staged tensors, None for bytes).

    CUDA copies are asynchronous, with one synchronization at the end.
    """
    if views is None:
        views = [
            arena.view(s, v.dtype, v.shape) if isinstance(v, torch.Tensor) else None
            for s, v in zip(slots, values, strict=True)
        ]
    cuda = False
    for value, slot, view in zip(values, slots, views, strict=True):
        if view is None:
            arena.write_bytes(slot, value)
        elif value.is_cuda:
            if not cuda:
                arena.pin()
            cuda = True
            view.copy_(value, non_blocking=True)
        else:
            view.copy_(value)
    if cuda:
        torch.cuda.synchronize()


def attach(fd: int, size: int) -> mmap.mmap:
    """Map an arena received from a rank (writer side)."""
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED)


def tensor_at(buf: mmap.mmap, offset: int, nbytes: int, dtype: torch.dtype, shape: Any) -> Any:
    """A tensor over the arena whose storage is exactly its own bytes (DCP won't clone it)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = nbytes // itemsize
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset).view(shape)
