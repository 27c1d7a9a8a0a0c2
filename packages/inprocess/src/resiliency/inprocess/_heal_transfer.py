"""The messages of healing, over ``torch.distributed`` (gloo on CPU, NCCL on GPU alike).

Every tensor that crosses goes through ``device``: the CPU for gloo, the rank's current CUDA
device for NCCL (which cannot send CPU tensors). Packing and checksums stay on the CPU.
Every wait is bounded by the process group's timeout; a peer that fails mid-transfer fails
the call (gloo: its closed sockets; the wrapper's abort ends the others' waits).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def transfer_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where healing's tensors travel for ``group``'s backend."""
    if "nccl" in str(dist.get_backend(group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_ints(
    values: list[int], group: dist.ProcessGroup | None, device: torch.device
) -> list[list[int]]:
    """All-gather a few integers from every rank of ``group`` (rank order)."""
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [t.tolist() for t in out]


def sum_flags(flags: list[int], group: dist.ProcessGroup | None, device: torch.device) -> list[int]:
    """Element-wise sum over ``group`` of one flag per rank."""
    t = torch.tensor(flags, dtype=torch.int64, device=device)
    dist.all_reduce(t, group=group)
    return [int(x) for x in t.tolist()]


def send(
    buffer: torch.Tensor, dst: int, group: dist.ProcessGroup | None, device: torch.device
) -> None:
    """Send a CPU ``uint8`` buffer to group rank ``dst``.

    Its length is not sent: the receiver knows it from the sources' agreed digest.
    """
    dist.send(buffer.to(device), _global(group, dst), group=group)


def recv(
    length: int, src: int, group: dist.ProcessGroup | None, device: torch.device
) -> torch.Tensor:
    """Receive ``length`` bytes sent by :func:`send` from group rank ``src``, on the CPU."""
    out = torch.empty(length, dtype=torch.uint8, device=device)
    dist.recv(out, _global(group, src), group=group)
    return out.cpu()


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
