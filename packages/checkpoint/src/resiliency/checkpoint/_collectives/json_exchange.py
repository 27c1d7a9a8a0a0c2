"""Small JSON exchanges between ranks, as bytes in uint8 tensors (never pickled objects).

torch's object collectives (``gather_object``, ``scatter_object_list``...) unpickle what a peer
sends; these helpers send ``json.dumps`` bytes through plain tensor collectives on CPU tensors
(gloo supports every one used here) and parse them on receipt (ARCHITECTURE decision 1). Every
rank pads its bytes to the longest payload, since gather and scatter move equal-sized tensors.
A value a rank cannot encode is announced as a length of -1 in the first collective, so every
rank raises the same ``ValueError`` instead of some waiting forever. ``group=None`` means one
process: nothing is sent.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


def all_gather_json(value: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's ``value``, on every rank (two collectives).

    Args:
        value: This rank's JSON-serializable value.
        group: The process group, or None for one process.

    Returns:
        The values parsed back from JSON, in group-rank order (tuples come back as lists).

    Raises:
        ValueError: On every rank, when some rank's value is not JSON-serializable.
    """
    if group is None:
        return [value]
    data, error = _dumps(value)
    lengths = _all_gather_lengths(len(data) if error is None else -1, group)
    _raise_on_bad(lengths, error, "all_gather_json")
    bufs, out = _buffers(len(lengths), max(lengths))
    dist.all_gather(out, _frame(data, max(lengths)), group=group)
    return [json.loads(b[:n]) for b, n in zip(bufs, lengths, strict=True)]


def gather_json(
    value: Any, dst_group_rank: int, group: dist.ProcessGroup | None
) -> list[Any] | None:
    """Every rank's ``value``, on one rank (two collectives).

    Args:
        value: This rank's JSON-serializable value.
        dst_group_rank: The rank, in ``group``, that receives the values.
        group: The process group, or None for one process.

    Returns:
        On ``dst_group_rank``: the values parsed back from JSON, in group-rank order; None on
        every other rank.

    Raises:
        ValueError: On every rank, when some rank's value is not JSON-serializable.
    """
    if group is None:
        return [value]
    data, error = _dumps(value)
    # Every rank learns every length: each pads to the longest, as gather needs.
    lengths = _all_gather_lengths(len(data) if error is None else -1, group)
    _raise_on_bad(lengths, error, "gather_json")
    longest = max(lengths)
    receiving = dist.get_rank(group) == dst_group_rank
    bufs, out = _buffers(len(lengths) if receiving else 0, longest)
    dist.gather(
        _frame(data, longest),
        out if receiving else None,
        dst=dist.get_global_rank(group, dst_group_rank),
        group=group,
    )
    if not receiving:
        return None
    return [json.loads(b[:n]) for b, n in zip(bufs, lengths, strict=True)]


def scatter_json(
    values: list[Any] | None, src_group_rank: int, group: dist.ProcessGroup | None
) -> Any:
    """One value per rank from one rank: rank ``r`` gets ``values[r]`` (two collectives).

    Args:
        values: On ``src_group_rank``, one JSON-serializable value per rank of the group;
            ignored on every other rank.
        src_group_rank: The rank, in ``group``, that sends.
        group: The process group, or None for one process.

    Returns:
        This rank's value, parsed back from JSON.

    Raises:
        ValueError: On every rank, when ``values`` on the sender is not one JSON-serializable
            value per rank.
    """
    if group is None:
        if values is None or len(values) != 1:
            raise ValueError("scatter_json without a group needs exactly one value")
        return values[0]
    world = dist.get_world_size(group)
    src = dist.get_global_rank(group, src_group_rank)
    me = dist.get_rank(group)
    sending = me == src_group_rank
    lengths = torch.zeros(world, dtype=torch.int64)
    datas: list[bytes] = []
    error: Exception | None = None
    if sending:
        if values is None or len(values) != world:
            n = "no" if values is None else len(values)
            error = ValueError(f"{n} values for a group of {world} ranks")
        else:
            for value in values:
                data, error = _dumps(value)
                if error is not None:
                    break
                datas.append(data)
        lengths[:] = -1 if error is not None else torch.tensor([len(d) for d in datas])
    # One broadcast gives every rank its own length, the padded length, or the sender's failure.
    dist.broadcast(lengths, src=src, group=group)
    sizes = [int(n) for n in lengths]
    if error is not None:
        raise ValueError(f"scatter_json: {error}") from error
    if sizes[0] < 0:
        raise ValueError(f"scatter_json: group rank {src_group_rank} could not encode its values")
    longest = max(sizes)
    bufs, out = _buffers(1, longest)
    dist.scatter(
        out[0],
        [_frame(d, longest) for d in datas] if sending else None,
        src=src,
        group=group,
    )
    return json.loads(bufs[0][: sizes[me]])


def _dumps(value: Any) -> tuple[bytes, Exception | None]:
    try:
        return json.dumps(value, separators=(",", ":")).encode(), None
    except (TypeError, ValueError) as exc:  # not serializable, or a reference cycle
        return b"", exc


def _all_gather_lengths(length: int, group: dist.ProcessGroup) -> list[int]:
    mine = torch.tensor([length], dtype=torch.int64)
    lengths = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(lengths, mine, group=group)
    return [int(n.item()) for n in lengths]


def _raise_on_bad(lengths: list[int], error: Exception | None, what: str) -> None:
    bad = [r for r, n in enumerate(lengths) if n < 0]
    if error is not None:
        raise ValueError(f"{what}: this rank's value is not JSON-serializable: {error}") from error
    if bad:
        raise ValueError(f"{what}: the value of group rank(s) {bad} is not JSON-serializable")


def _buffers(count: int, length: int) -> tuple[list[bytearray], list[torch.Tensor]]:
    """Receive buffers: tensors that share memory with bytearrays (read without NumPy)."""
    bufs = [bytearray(length) for _ in range(count)]
    return bufs, [torch.frombuffer(b, dtype=torch.uint8) for b in bufs]


def _frame(data: bytes, length: int) -> torch.Tensor:
    """``data`` padded with zeros to ``length`` bytes, as a uint8 tensor."""
    buf = bytearray(length)
    buf[: len(data)] = data
    return torch.frombuffer(buf, dtype=torch.uint8)
