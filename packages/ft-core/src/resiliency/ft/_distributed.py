"""Agreement across ranks through torch.distributed, used only when it is already initialized.

ft-core does not depend on torch: it is looked up in ``sys.modules``, so a process that never
imported torch never pays for importing it here (and cannot have initialized a process group).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any


def _initialized_dist() -> Any | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def distributed_initialized() -> bool:
    """Whether torch.distributed's default process group exists in this process."""
    return _initialized_dist() is not None


def collective_device_type(backend: str) -> str:
    """The device type of the tensors a process group's collectives take.

    NCCL alone takes CUDA tensors only; gloo, a mixed ``cpu:gloo,cuda:nccl`` group and the
    other backends take CPU tensors. (resiliency-straggler applies the same rule in its own
    copy: it depends on nothing, and ft-core does not depend on it.)
    """
    return "cuda" if "nccl" in backend and "gloo" not in backend else "cpu"


def _device(dist: Any, group: Any) -> Any:
    import torch  # noqa: PLC0415 (torch is optional; it is already imported when we get here)

    if collective_device_type(str(dist.get_backend(group))) == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_agree(ok: bool, process_group: Any = None) -> bool:
    """Whether every rank of the group passes ``ok=True`` (one small all-reduce).

    Every rank must call it at the same point, whether its own step worked or not: that is
    what lets a rank that failed skip a later collective without leaving the others in it.
    Without an initialized default process group it returns ``ok``.
    """
    dist = _initialized_dist()
    if dist is None:
        return ok
    import torch  # noqa: PLC0415

    flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=_device(dist, process_group))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=process_group)
    return bool(flag.item())


def allreduce_max(values: Mapping[str, float], process_group: Any = None) -> dict[str, float]:
    """Return, for every key any rank has, the maximum of its values over all ranks.

    Every rank must call this at the same point (it runs collectives). Without an initialized
    default process group it returns ``values`` unchanged.

    Args:
        values: This rank's non-negative values by key.
        process_group: The group to reduce over (default: the default group).

    Returns:
        The union of keys over all ranks, each with its maximum value.
    """
    dist = _initialized_dist()
    if dist is None:
        return dict(values)
    import torch  # noqa: PLC0415

    device = _device(dist, process_group)
    # Ranks may have observed different sections: agree on the union of names first.
    encoded = json.dumps(sorted(values)).encode()
    length = torch.tensor([len(encoded)], dtype=torch.int64, device=device)
    dist.all_reduce(length, op=dist.ReduceOp.MAX, group=process_group)
    buf = torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    buf[: len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8, device=device)
    gathered = [torch.zeros_like(buf) for _ in range(dist.get_world_size(process_group))]
    dist.all_gather(gathered, buf, group=process_group)
    keys: set[str] = set()
    for tensor in gathered:
        keys.update(json.loads(bytes(tensor.cpu().tolist()).rstrip(b"\0")))
    ordered = sorted(keys)
    if not ordered:
        return {}
    vector = torch.tensor(
        [float(values.get(key, -1.0)) for key in ordered], dtype=torch.float64, device=device
    )
    dist.all_reduce(vector, op=dist.ReduceOp.MAX, group=process_group)
    return {key: value for key, value in zip(ordered, vector.tolist(), strict=True) if value >= 0}
