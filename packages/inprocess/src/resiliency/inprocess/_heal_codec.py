"""Pack a state (``{name: obj.state_dict()}``) into one byte buffer and back, without pickle.

The structure goes as tagged JSON (tuples, int keys and tensors survive the round trip), the
tensors' bytes follow it in one ``uint8`` buffer. A buffer is checked with CRC-32, the checksum
resiliency-checkpoint's manifests use (zlib's, ~3 GB/s here).

Layout: ``[header length, 8 bytes little-endian][header JSON][tensor bytes...]``, every tensor
starting at a multiple of 16 bytes (a dtype view of the buffer needs its element alignment).
"""

from __future__ import annotations

import ctypes
import json
import zlib
from collections.abc import Mapping
from typing import Any

import torch

from resiliency.inprocess.exception import HealError

_LEN_BYTES = 8
_ALIGN = 16


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _crc_of(tensor: torch.Tensor, crc: int = 0) -> int:
    """Update ``crc`` with a CPU tensor's bytes, read in place.

    Through ctypes, not ``Tensor.numpy()``: torch's CPU wheel does not need NumPy, and this
    package does not depend on it (without it ``numpy()`` raises "Numpy is not available").
    """
    flat = tensor.contiguous()  # kept alive until the CRC is taken
    size = flat.numel() * flat.element_size()
    return zlib.crc32((ctypes.c_char * size).from_address(flat.data_ptr()), crc)


def _bytes_of(tensor: torch.Tensor) -> bytes:
    """A copy of a CPU tensor's bytes (no NumPy, see :func:`_crc_of`)."""
    flat = tensor.contiguous()
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())


def crc32(buffer: torch.Tensor) -> int:
    """CRC-32 of a CPU ``uint8`` tensor's bytes."""
    return _crc_of(buffer) & 0xFFFFFFFF


def digest(state: Mapping[str, Any]) -> tuple[int, int]:
    """``(crc32, length)`` of what :func:`pack` would return, without building it.

    Every source checksums its state, but only the one asked to send packs it: this reads
    each tensor's bytes in place (CPU tensors are not copied).
    """
    tensors: list[torch.Tensor] = []
    header = json.dumps(_encode(dict(state), tensors, "state")).encode()
    head = len(header).to_bytes(_LEN_BYTES, "little") + header
    start = _aligned(len(head))
    crc = zlib.crc32(head + bytes(start - len(head)))
    length = start
    for tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        if size:
            crc = _crc_of(tensor, crc)
        crc = zlib.crc32(bytes(_aligned(size) - size), crc)
        length += _aligned(size)
    return crc & 0xFFFFFFFF, length


def pack(state: Mapping[str, Any]) -> torch.Tensor:
    """Return one CPU ``uint8`` tensor holding ``state`` (nested state dicts of tensors).

    Raises:
        HealError: a value is neither a tensor nor plain data (None, bool, int, float, str,
            list, tuple, dict).
    """
    tensors: list[torch.Tensor] = []
    header = json.dumps(_encode(dict(state), tensors, "state")).encode()
    sizes = [t.numel() * t.element_size() for t in tensors]
    start = _aligned(_LEN_BYTES + len(header))
    # empty, not zeros: the tensors' bytes are written once; only the padding is zeroed
    out = torch.empty(start + sum(_aligned(s) for s in sizes), dtype=torch.uint8)
    out[:_LEN_BYTES] = torch.tensor(list(len(header).to_bytes(_LEN_BYTES, "little")))
    out[_LEN_BYTES : _LEN_BYTES + len(header)] = torch.frombuffer(
        bytearray(header), dtype=torch.uint8
    )
    out[_LEN_BYTES + len(header) : start] = 0
    offset = start
    for tensor, size in zip(tensors, sizes, strict=True):
        if size:
            out[offset : offset + size].copy_(tensor.reshape(-1).view(torch.uint8))
        out[offset + size : offset + _aligned(size)] = 0
        offset += _aligned(size)
    return out


def unpack(buffer: torch.Tensor) -> dict[str, Any]:
    """Rebuild the state packed by :func:`pack` (tensors are views of ``buffer``, on CPU).

    Raises:
        HealError: the buffer is not a packed state (a malformed header, sizes that do not add
            up); it was verified by its checksum first, so this means a version mismatch.
    """
    try:
        length = int.from_bytes(bytes(buffer[:_LEN_BYTES].tolist()), "little")
        header = json.loads(_bytes_of(buffer[_LEN_BYTES : _LEN_BYTES + length]))
        decoder = _Decoder(buffer, _aligned(_LEN_BYTES + length))
        state = decoder.decode(header)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError, AttributeError) as exc:
        raise HealError(
            f"the received state cannot be decoded: {type(exc).__name__}: {exc}"
        ) from exc
    if decoder.offset != buffer.numel() or not isinstance(state, dict):
        raise HealError(
            f"the received state cannot be decoded: {buffer.numel() - decoder.offset} bytes "
            "left over after the last tensor"
        )
    return state


def _encode(value: Any, tensors: list[torch.Tensor], path: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        tensors.append(tensor)
        return {"t": [str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]}
    if isinstance(value, list):
        return {"l": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, tuple):
        return {"u": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return {
            "d": [
                [_encode(k, tensors, f"{path} key"), _encode(v, tensors, f"{path}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    raise HealError(
        f"{path} is a {type(value).__name__}: only tensors and plain data (None, bool, int, "
        "float, str, list, tuple, dict) can be sent to a peer; return it from state_dict() as "
        "one of those, or restore it per rank (Healer's per_rank)"
    )


class _Decoder:
    def __init__(self, buffer: torch.Tensor, offset: int) -> None:
        self.buffer = buffer
        self.offset = offset

    def decode(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        [(tag, body)] = value.items()
        if tag == "l":
            return [self.decode(v) for v in body]
        if tag == "u":
            return tuple(self.decode(v) for v in body)
        if tag == "d":
            return {self.decode(k): self.decode(v) for k, v in body}
        if tag == "t":
            return self.tensor(*body)
        raise ValueError(f"unknown tag {tag!r}")

    def tensor(self, dtype_name: str, shape: list[int]) -> torch.Tensor:
        dtype = getattr(torch, dtype_name)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{dtype_name!r} is not a torch dtype")
        count = 1
        for dim in shape:
            count *= int(dim)
        size = count * torch.empty((), dtype=dtype).element_size()
        if self.offset + size > self.buffer.numel():
            raise ValueError(f"a {dtype_name} tensor of shape {shape} runs past the buffer")
        raw = self.buffer[self.offset : self.offset + size]
        self.offset += _aligned(size)
        return raw.view(dtype).reshape(shape)
