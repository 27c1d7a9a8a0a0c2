"""``AppState``: a ready DCP ``Stateful`` for a model, its optimizer, RNG and loader states.

Model and optimizer go through ``get_state_dict``/``set_state_dict`` (DDP, FSDP and plain
modules alike). Everything that differs per rank -- the RNG states and every ``extra`` value,
such as a sampler or data-loader position -- is stored under ``rank_<r>``: DCP writes plain
tensors of the same name once, as if replicated, so an unkeyed per-rank value would come back
as another rank's. Restoring therefore expects the same number of ranks for those values.
"""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

__all__ = ["AppState"]


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    version, internal, gauss = random.getstate()
    state["python"] = torch.tensor(internal, dtype=torch.int64)
    state["python_meta"] = torch.tensor(
        [float(version), float(gauss is not None), float(gauss or 0.0)], dtype=torch.float64
    )
    try:
        import numpy as np  # noqa: PLC0415 -- optional
    except ImportError:
        np = None  # type: ignore[assignment]
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        if name == "MT19937":
            state["numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64).copy())
            state["numpy_meta"] = torch.tensor(
                [float(pos), float(has_gauss), float(cached)], dtype=torch.float64
            )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda{i}"] = s
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    meta = state["python_meta"].tolist()
    internal = tuple(int(x) for x in state["python"].tolist())
    random.setstate((int(meta[0]), internal, meta[2] if meta[1] else None))
    if "numpy" in state:
        try:
            import numpy as np  # noqa: PLC0415
        except ImportError:
            np = None  # type: ignore[assignment]
        if np is not None:
            pos, has_gauss, cached = state["numpy_meta"].tolist()
            keys = state["numpy"].numpy().astype(np.uint32)
            np.random.set_state(("MT19937", keys, int(pos), int(has_gauss), float(cached)))
    cuda = [state[k] for k in sorted(state) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


class AppState(Stateful):
    """Everything a training loop needs to resume, as one DCP ``Stateful``.

    Args:
        model: the (possibly DDP/FSDP-wrapped) module.
        optimizer: its optimizer, or None.
        rng: also save and restore this rank's torch, Python and NumPy RNG states (and CUDA's
            when CUDA is initialized).
        **extra: per-rank values: objects with ``state_dict``/``load_state_dict`` (a sampler,
            a stateful data loader) are restored in place; any other value (an int, a dict)
            is restored into ``self.extra[name]``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        rng: bool = True,
        **extra: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.rng = rng
        self.extra: dict[str, Any] = dict(extra)

    def _per_rank(self) -> dict[str, Any]:
        mine: dict[str, Any] = {}
        if self.rng:
            mine["rng"] = _rng_state()
        for name, value in self.extra.items():
            mine[name] = value.state_dict() if isinstance(value, Stateful) else value
        return mine

    def state_dict(self) -> dict[str, Any]:
        """The state DCP saves: ``model``, ``optim`` and this rank's ``rank_<r>``."""
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(self.model, optimizers)
        state: dict[str, Any] = {"model": model_sd, f"rank_{_rank()}": self._per_rank()}
        if self.optimizer is not None:
            state["optim"] = optim_sd
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the model, the optimizer, this rank's RNG states and extra values."""
        optimizers = [self.optimizer] if self.optimizer is not None else []
        set_state_dict(
            self.model,
            optimizers,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict.get("optim", {}),
        )
        mine = state_dict.get(f"rank_{_rank()}", {})
        if self.rng and "rng" in mine:
            _set_rng_state(mine["rng"])
        for name, value in self.extra.items():
            if name not in mine:
                continue
            if isinstance(value, Stateful):
                value.load_state_dict(mine[name])
            else:
                self.extra[name] = mine[name]
