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


def allreduce_max(values: Mapping[str, float]) -> dict[str, float]:
    """Return, for every key any rank has, the maximum of its values over all ranks.

    Every rank must call this at the same point (it runs collectives). Without an initialized
    default process group it returns ``values`` unchanged.

    Args:
        values: This rank's non-negative values by key.

    Returns:
        The union of keys over all ranks, each with its maximum value.
    """
    dist = _initialized_dist()
    if dist is None:
        return dict(values)
    import torch  # noqa: PLC0415 (torch is optional; it is already imported when we get here)

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    # Ranks may have observed different sections: agree on the union of names first.
    encoded = json.dumps(sorted(values)).encode()
    length = torch.tensor([len(encoded)], dtype=torch.int64, device=device)
    dist.all_reduce(length, op=dist.ReduceOp.MAX)
    buf = torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    buf[: len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8, device=device)
    gathered = [torch.zeros_like(buf) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, buf)
    keys: set[str] = set()
    for tensor in gathered:
        keys.update(json.loads(bytes(tensor.cpu().tolist()).rstrip(b"\0")))
    ordered = sorted(keys)
    if not ordered:
        return {}
    vector = torch.tensor(
        [float(values.get(key, -1.0)) for key in ordered], dtype=torch.float64, device=device
    )
    dist.all_reduce(vector, op=dist.ReduceOp.MAX)
    return {key: value for key, value in zip(ordered, vector.tolist(), strict=True) if value >= 0}
