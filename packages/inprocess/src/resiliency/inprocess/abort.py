"""Abort callbacks: make the main thread leave a collective that will never complete.

An ``Abort`` runs in the wrapper's monitor thread when a fault is detected, while the main
thread may still be blocked inside a collective waiting for a failed or hung peer.
"""

from __future__ import annotations

import abc
import logging

import torch
import torch.distributed as dist

from resiliency.inprocess import _gloo_sockets, _torch_compat
from resiliency.inprocess.state import FrozenState

log = logging.getLogger(__name__)


class Abort(abc.ABC):
    """Base class of the ``abort`` argument of ``Wrapper``; compose several with ``Compose``."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        """Abort this rank's pending distributed work.

        Args:
            state: read-only wrapper state.

        Returns:
            ``state``, unchanged, for the next callable in a ``Compose``.
        """


class _SocketBaseline:
    """The sockets open before the current call of the wrapped function (set by the wrapper)."""

    sockets: frozenset[tuple[int, int]] = frozenset()
    store_ports: frozenset[int] = frozenset()


def set_socket_baseline(sockets: frozenset[tuple[int, int]], store_ports: set[int]) -> None:
    """Record the sockets that existed before the wrapped function started (wrapper only)."""
    _SocketBaseline.sockets = sockets
    _SocketBaseline.store_ports = frozenset(store_ports)


class AbortTorchDistributed(Abort):
    """Abort every torch.distributed process group, then destroy them.

    NCCL groups are aborted through torch's process-group abort. On gloo, whose abort does not
    end a pending collective, the TCP sockets the wrapped function opened (gloo's pairs, and the
    store client its ``init_process_group`` may be waiting on) are shut down: the wait fails at
    once on this rank and on its peers. The wrapper's own store connections are kept. NCCL's
    abort comes first: it stops the group's heartbeat monitor, whose thread otherwise reads the
    store through a socket just shut down and logs a C++ stack trace of the broken pipe (seen on
    an H200 with torch 2.11 when the order was the other way round).
    """

    def __call__(self, state: FrozenState) -> FrozenState:
        """Abort and destroy every process group (see the class docstring)."""
        initialized = dist.is_available() and dist.is_initialized()
        backends = self._abort_groups(state) if initialized else set()
        closed = _gloo_sockets.shutdown_new_tcp(
            _SocketBaseline.sockets, set(_SocketBaseline.store_ports)
        )
        if not initialized:
            _torch_compat.reset_group_names()  # an interrupted init_process_group counted one
            log.info("rank %d: abort: shut down %d sockets; no process group", state.rank, closed)
            return state
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError) as exc:
            log.warning("rank %d: abort: destroy_process_group failed: %s", state.rank, exc)
        log.info(
            "rank %d: abort: shut down %d sockets, aborted process groups (%s), destroyed them",
            state.rank,
            closed,
            ", ".join(sorted(backends)) or "none",
        )
        return state

    @staticmethod
    def _abort_groups(state: FrozenState) -> set[str]:
        backends: set[str] = set()
        world = dist.distributed_c10d._world
        for group in list(world.pg_map):
            try:
                name = str(dist.get_backend(group))
            except (RuntimeError, ValueError):
                continue
            backends.add(name)
            if name == "nccl" and torch.cuda.is_available():
                try:
                    group._get_backend(torch.device("cuda")).abort()
                except RuntimeError as exc:
                    log.warning("rank %d: NCCL abort failed: %s", state.rank, exc)
        return backends
