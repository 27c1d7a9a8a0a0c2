"""Cross-rank exchange of summaries through ``torch.distributed``, when it is initialized.

Torch is never imported here unless the program already imported it: if ``torch`` is not in
``sys.modules``, no process group can exist and the Detector runs single-rank. Every collective runs
on the process group the Detector was given (the default group otherwise), so users of sub-groups
do not deadlock. Payloads travel as padded ``uint8`` tensors, never pickled objects.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any, Protocol

from resiliency.straggler.errors import ExchangeError, StragglerConfigError

__all__ = ["Exchange", "TorchExchange", "make_exchange"]

log = logging.getLogger(__name__)


class Exchange(Protocol):
    """The collectives the Detector needs; every member of the group must call them in step."""

    rank: int
    size: int
    is_root: bool

    def gather(self, payload: bytes, *, to_all: bool) -> list[bytes] | None:
        """Collect every member's payload (on the root only unless ``to_all``), in group order."""
        ...

    def broadcast_int(self, value: int) -> int:
        """Return the root's ``value`` on every member."""
        ...


def _collective_device_type(backend: str) -> str:
    """The device type of the tensors a process group's collectives take.

    NCCL alone takes CUDA tensors only; gloo, a mixed ``cpu:gloo,cuda:nccl`` group and the other
    backends take CPU tensors. resiliency-ft-core applies the same rule in its own copy: neither
    package may depend on a sibling, and a one-line rule is not worth a shared distribution.
    tests/straggler/test_exchange_device.py checks that the two copies agree.

    Args:
        backend: The group's backend, as ``torch.distributed.get_backend`` spells it.

    Returns:
        ``"cuda"`` or ``"cpu"``.
    """
    return "cuda" if "nccl" in backend and "gloo" not in backend else "cpu"


class TorchExchange:
    """:class:`Exchange` over a ``torch.distributed`` process group.

    Args:
        process_group: The group to use; ``None`` for the default group.

    Raises:
        StragglerConfigError: This process is not a member of ``process_group``.
    """

    def __init__(self, process_group: Any = None) -> None:
        # Lazy on purpose: the package must import, and run single-rank, without torch.
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        self._torch = torch
        self._dist = dist
        self._group = process_group
        self.rank: int = dist.get_rank()
        group_rank = dist.get_rank(process_group) if process_group is not None else self.rank
        if group_rank < 0:
            raise StragglerConfigError(
                f"rank {self.rank} is not a member of the process_group given to "
                "Detector.initialize(); call initialize() only on the group's members"
            )
        self.size: int = dist.get_world_size(process_group)
        self.is_root: bool = group_rank == 0
        self._root = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        if _collective_device_type(str(dist.get_backend(process_group))) == "cuda":
            self._device = torch.device("cuda", torch.cuda.current_device())
        else:
            self._device = torch.device("cpu")

    def _fail(self, what: str, exc: Exception) -> ExchangeError:
        return ExchangeError(
            f"rank {self.rank}: {what} on a group of {self.size} ranks failed: {exc}; "
            "every rank of the group must call Detector.generate_report() (or the interval check) "
            "the same number of times"
        )

    def broadcast_int(self, value: int) -> int:
        """Return the group root's ``value`` on every member.

        Raises:
            ExchangeError: The collective failed (a peer died, a timeout).
        """
        tensor = self._torch.tensor([value], dtype=self._torch.int64, device=self._device)
        try:
            self._dist.broadcast(tensor, src=self._root, group=self._group)
        except Exception as exc:
            raise self._fail("broadcast of the report decision", exc) from exc
        return int(tensor.item())

    def gather(self, payload: bytes, *, to_all: bool) -> list[bytes] | None:
        """Collect every member's payload, in group-rank order.

        Args:
            payload: This rank's bytes.
            to_all: Deliver to every member (all-gather) rather than to the root only.

        Returns:
            The payloads, or ``None`` on a non-root member when ``to_all`` is false.

        Raises:
            ExchangeError: A collective failed.
        """
        torch, dist = self._torch, self._dist
        size_t = torch.tensor([len(payload)], dtype=torch.int64, device=self._device)
        sizes = [torch.zeros_like(size_t) for _ in range(self.size)]
        try:
            dist.all_gather(sizes, size_t, group=self._group)
        except Exception as exc:
            raise self._fail("all-gather of summary sizes", exc) from exc
        lengths = [int(s.item()) for s in sizes]
        width = max(*lengths, 1)
        buf = torch.zeros(width, dtype=torch.uint8)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        buf = buf.to(self._device)
        want = to_all or self.is_root
        outs = [torch.empty_like(buf) for _ in range(self.size)] if want else None
        try:
            if to_all:
                dist.all_gather(outs, buf, group=self._group)
            else:
                dist.gather(buf, gather_list=outs, dst=self._root, group=self._group)
        except Exception as exc:
            raise self._fail("gather of summaries", exc) from exc
        if outs is None:
            return None
        flat = torch.cat(outs).cpu().contiguous()
        raw = ctypes.string_at(flat.data_ptr(), flat.numel())
        return [raw[i * width : i * width + n] for i, n in enumerate(lengths)]


def make_exchange(process_group: Any = None) -> TorchExchange | None:
    """Return an exchange over ``torch.distributed`` when it is initialized, else ``None``.

    Args:
        process_group: The group to use; ``None`` for the default group.

    Returns:
        A :class:`TorchExchange`, or ``None`` for a single-process run (no torch, or no process
        group initialized).

    Raises:
        StragglerConfigError: ``process_group`` was given but ``torch.distributed`` is not
            initialized, or this rank is not a member of it.
    """
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    initialized = bool(dist is not None and dist.is_available() and dist.is_initialized())
    if not initialized:
        if process_group is not None:
            raise StragglerConfigError(
                "a process_group was given but torch.distributed is not initialized; call "
                "torch.distributed.init_process_group() before Detector.initialize()"
            )
        log.debug("torch.distributed is not initialized: straggler detection runs single-rank")
        return None
    return TorchExchange(process_group)
