"""The keys the ranks share in the wrapper's store, and what each one means.

Everything is JSON or a decimal counter: nothing crossing processes is pickled. Ranks are
named by their *initial* rank (stable for the process's life); an iteration's keys live under
``<iteration>/``. Global keys:

``hb/<initial>``            heartbeat counter, bumped every ``heartbeat_interval``
``terminated``              ``"<initial>,"`` appended for every rank that left the job
``terminated/<initial>``    JSON: why it left
``current``                 the newest iteration a rank entered (a respawned process joins it)

Per iteration ``n``:

``n/faults``                counter of fault reports
``n/fault/<initial>``       JSON fault record (kind, reason, where, time)
``n/arrived``               ``"<initial>,"`` appended by each rank at the restart barrier
``n/decided``               the agreed survivors (first writer wins, ``compare_set``)
``n/completed``             counter of ranks whose function returned
``n/progress``              counter of progress marks (``ping()``, completed ``atomic()`` blocks)
``n/rank/<initial>``        the rank this initial rank had in iteration ``n``
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from resiliency.inprocess._launcher_contract import STORE_PORT_ENV
from resiliency.inprocess.exception import ConfigError, InternalError
from resiliency.inprocess.store import TCPStore

log = logging.getLogger(__name__)

PREFIX = "resiliency.inprocess/"


def _int_list(raw: bytes) -> list[int]:
    return [int(item) for item in raw.decode().split(",") if item.strip()]


class RestartStore:
    """Typed access to the wrapper's keys (see the module docstring) on one store client."""

    def __init__(self, store: dist.Store) -> None:
        # Any: torch's stubs lack Store.append, which torch 2.13 has.
        self.store: Any = dist.PrefixStore(PREFIX, store)

    def _count(self, key: str) -> int:
        return int(self.store.add(key, 0))

    def _list(self, key: str) -> list[int]:
        if not self.store.check([key]):
            return []
        return _int_list(self.store.get(key))

    # heartbeats and departures, for the life of the job
    def heartbeat(self, initial: int) -> None:
        """Bump this rank's heartbeat counter."""
        self.store.add(f"hb/{initial}", 1)

    def heartbeats(self, initials: list[int]) -> dict[int, int]:
        """Read the heartbeat counters of the given ranks."""
        return {r: self._count(f"hb/{r}") for r in initials}

    def mark_terminated(self, initial: int, reason: str) -> None:
        """Record that a rank left the job, and why."""
        self.store.set(f"terminated/{initial}", json.dumps({"reason": reason, "time": time.time()}))
        self.store.append("terminated", f"{initial},")

    def leave_job(self, state: Any, exc: BaseException) -> None:
        """This rank (``state``: its ``State``) stops for good: tell the others before going."""
        reason = f"{type(exc).__name__}: {exc}"
        log.error("rank %d: iteration %d: leaving the job: %s", state.rank, state.iteration, reason)
        try:
            self.mark_terminated(state.initial_rank, reason)
        except Exception as store_exc:
            log.error("rank %d: could not record leaving: %s", state.rank, store_exc)

    def terminated(self) -> set[int]:
        """Initial ranks that left the job."""
        return set(self._list("terminated"))

    def termination_reason(self, initial: int) -> str:
        """Why a rank left (its record, or "unknown")."""
        key = f"terminated/{initial}"
        if not self.store.check([key]):
            return "unknown"
        return str(json.loads(self.store.get(key)).get("reason", "unknown"))

    # one restart iteration
    def report_fault(self, iteration: int, initial: int, record: dict[str, Any]) -> None:
        """Publish this rank's fault for ``iteration``; every monitor sees the counter move.

        The record gets the wall time of the report (``time``) unless it has one.
        """
        record = {"time": time.time(), **record}
        self.store.set(f"{iteration}/fault/{initial}", json.dumps(record, default=str))
        self.store.add(f"{iteration}/faults", 1)

    def fault_count(self, iteration: int) -> int:
        """How many faults were reported in ``iteration``."""
        return self._count(f"{iteration}/faults")

    def faults(self, iteration: int, initials: list[int]) -> dict[int, dict[str, Any]]:
        """The fault records of ``iteration`` published by the given ranks."""
        out = {}
        for r in initials:
            key = f"{iteration}/fault/{r}"
            if self.store.check([key]):
                out[r] = json.loads(self.store.get(key))
        return out

    def arrive(self, iteration: int, initial: int) -> None:
        """Enter the restart barrier of ``iteration``."""
        self.store.append(f"{iteration}/arrived", f"{initial},")

    def arrived(self, iteration: int) -> set[int]:
        """Initial ranks at the restart barrier of ``iteration``."""
        return set(self._list(f"{iteration}/arrived"))

    @staticmethod
    def decided_key(iteration: int) -> str:
        """The key ``decide`` writes for ``iteration`` (what a waiting rank watches for)."""
        return f"{iteration}/decided"

    def decide(self, iteration: int, survivors: list[int]) -> list[int]:
        """Propose the survivors of ``iteration``; return the value every rank agrees on."""
        key = self.decided_key(iteration)
        proposal = ",".join(str(r) for r in sorted(survivors))
        agreed = self.store.compare_set(key, "", proposal)
        return _int_list(agreed)

    def enter(self, iteration: int, initial: int, rank: int) -> None:
        """Record that ``initial`` runs ``iteration`` as ``rank`` (the job's newest iteration)."""
        self.store.set(f"{iteration}/rank/{initial}", str(rank))
        self.store.set("current", str(iteration))

    def current(self) -> int | None:
        """The newest iteration a rank entered; None before the first call."""
        if not self.store.check(["current"]):
            return None
        return int(self.store.get("current"))

    def rank_in(self, iteration: int, initial: int) -> int | None:
        """The rank ``initial`` had in ``iteration`` (None if it never entered it)."""
        key = f"{iteration}/rank/{initial}"
        return int(self.store.get(key)) if self.store.check([key]) else None

    def decided(self, iteration: int) -> list[int] | None:
        """The agreed survivors of ``iteration``'s restart barrier (None while undecided)."""
        key = self.decided_key(iteration)
        return _int_list(self.store.get(key)) if self.store.check([key]) else None

    def add_progress(self, iteration: int, marks: int) -> None:
        """Add this rank's progress marks of ``iteration`` (before its restart barrier)."""
        self.store.add(f"{iteration}/progress", marks)

    def progress(self, iteration: int) -> int:
        """Progress marks of every rank in ``iteration``."""
        return self._count(f"{iteration}/progress")

    def complete(self, iteration: int) -> None:
        """Record that this rank's function returned in ``iteration``."""
        self.store.add(f"{iteration}/completed", 1)

    def completed(self, iteration: int) -> int:
        """How many ranks' functions returned in ``iteration``."""
        return self._count(f"{iteration}/completed")


def connect(
    host: str, port: int, *, is_master: bool, world_size: int, timeout: timedelta
) -> dist.Store:
    """Open a TCPStore client (or the server, on the hosting rank), with a clear error.

    Raises:
        InternalError: the store could not be reached or bound within ``timeout``.
    """
    try:
        return TCPStore._open(
            host, port, is_master=is_master, world_size=world_size, timeout=timeout
        )
    except (RuntimeError, OSError) as exc:
        role = "host" if is_master else "reach"
        raise InternalError(
            f"could not {role} the in-process restart store at {host}:{port} within "
            f"{timeout.total_seconds():g} s ({exc}); set store_kwargs={{'port': ...}} to a free "
            "port reachable from every node, or check that rank 0 is alive"
        ) from exc


def open_store(
    factory: Callable[..., dist.Store] | None,
    kwargs: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    timeout: float,
) -> tuple[dist.Store, set[int], bool]:
    """Open the wrapper's store: the user's ``store_factory(**kwargs)``; else, under
    ``ft-launcher --ft-inprocess-respawn``, the TCPStore node 0's launcher hosts (its port in
    ``STORE_PORT_ENV``); else a TCPStore hosted by rank 0 at ``MASTER_ADDR:MASTER_PORT+1``
    (NVRx's choice). ``store_kwargs``' ``port`` or ``host_name`` always wins.

    Returns:
        The store, the ports its connections use (their sockets survive an abort), and whether
        this rank hosts it.

    Raises:
        ConfigError: no port is known.
        InternalError: the store could not be reached or bound.
    """
    if factory is not None:
        store = factory(**kwargs)
        port = getattr(store, "port", None)
        # NVRx's TCPStore (inprocess.store) knows whether this rank hosts it: then this rank
        # leaves last, as for the default store.
        hosting = isinstance(store, TCPStore) and store.hosting
        return store, {port} if isinstance(port, int) else set(), hosting
    host = kwargs.get("host_name", os.environ.get("MASTER_ADDR", "127.0.0.1"))
    hosted_by_launcher = os.environ.get(STORE_PORT_ENV, "")
    hosting = rank == 0
    if "port" in kwargs:
        port = int(kwargs["port"])
    elif hosted_by_launcher.isdigit() and "host_name" not in kwargs:
        # ft-launcher --ft-inprocess-respawn hosts it on node 0: it outlives every rank.
        port, hosting = int(hosted_by_launcher), False
    elif os.environ.get("MASTER_PORT", "").isdigit():
        port = int(os.environ["MASTER_PORT"]) + 1
    else:
        raise ConfigError(
            "resiliency.inprocess: MASTER_PORT is not set: pass store_kwargs={'port': ...} "
            "or start the job with torchrun"
        )
    store = connect(
        host,
        port,
        is_master=hosting,
        world_size=world_size,
        timeout=kwargs.get("timeout", timedelta(seconds=timeout)),
    )
    return store, {port}, hosting
