"""Small CPU collectives (gloo) through which every rank agrees on an outcome.

Each is one or two tensor collectives on the manager's control group, bounded by that group's
timeout; with no group (one process) they return the local value.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

MESSAGE_BYTES = 512


def max_code(code: int, group: dist.ProcessGroup | None) -> int:
    """Return the largest status code of all ranks."""
    if group is None:
        return code
    t = torch.tensor([code], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def gather_messages(message: str, group: dist.ProcessGroup | None) -> list[str]:
    """Every rank's (truncated) message, on every rank."""
    if group is None:
        return [message]
    data = message.encode()[:MESSAGE_BYTES]
    mine = torch.zeros(MESSAGE_BYTES + 2, dtype=torch.uint8)
    mine[:2] = torch.tensor([len(data) >> 8, len(data) & 0xFF], dtype=torch.uint8)
    if data:
        mine[2 : 2 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    texts = []
    for t in out:
        n = (int(t[0]) << 8) | int(t[1])
        texts.append(bytes(t[2 : 2 + n].tolist()).decode(errors="replace"))
    return texts


def min_max(values: list[int], group: dist.ProcessGroup | None) -> tuple[list[int], list[int]]:
    """Element-wise minimum and maximum of ``values`` over all ranks (one collective)."""
    if group is None:
        return list(values), list(values)
    t = torch.tensor([*values, *(-v for v in values)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    n = len(values)
    return [int(x) for x in t[:n]], [-int(x) for x in t[n:]]
