"""How every rank agrees on ONE emergency stop step without a collective per training step.

The protocol, over the job's c10d store (first-writer-wins ``compare_set``, ~15 us a round trip):

* A rank that saw a signal proposes ``stop_at = step + lead`` with ``compare_set(key, "", value)``.
  The store keeps the first proposal; every proposer gets that first value back and adopts it.
* Every other rank checks the key (``store.check``) once every ``check_every`` steps, staggered
  by rank so the store serves ``world / check_every`` checks per step, not ``world``.
* The rule that makes this safe: ``lead >= check_every + max_drift``. ``max_drift`` is how many
  steps a rank's loop can run ahead of the rank that proposes (1 for any loop with a blocking
  collective or a host sync per step: a rank cannot finish step ``s + 1`` before every rank
  entered step ``s``). When the proposal lands, every rank is at most at step
  ``s + max_drift`` and checks again within ``check_every`` steps, so it learns ``stop_at``
  no later than step ``s + max_drift + check_every <= stop_at``: no rank can have passed it.
* At the stop step the ranks agree the same way on what to save (the budget plan), and count
  themselves done afterwards so the rank that hosts the store leaves last.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from torch.distributed import TCPStore

__all__ = ["StopAgreement", "StopRecord", "check_lead", "default_store", "key_prefix"]

logger = logging.getLogger(__name__)

_STORE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StopRecord:
    """The agreed stop: the step every rank saves, who proposed it, and the SIGKILL deadline.

    Attributes:
        step: the step every rank stops at and saves.
        rank: the rank whose proposal won.
        signal: the name of the signal that rank saw.
        deadline: wall-clock time (``time.time()``) of the expected SIGKILL, or None if unknown.
    """

    step: int
    rank: int
    signal: str
    deadline: float | None

    def encode(self) -> str:
        """Return the record as the JSON text stored under the stop key."""
        return json.dumps(
            {"step": self.step, "rank": self.rank, "signal": self.signal, "deadline": self.deadline}
        )

    @classmethod
    def decode(cls, raw: bytes | str) -> StopRecord:
        """Parse a stored record.

        Args:
            raw: the stored JSON text.

        Returns:
            The record.

        Raises:
            ValueError: the value is not a stop record.
        """
        text = raw.decode() if isinstance(raw, bytes) else raw
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            raise ValueError(f"not an emergency stop record: {text[:200]!r}")
        deadline = data.get("deadline")
        return cls(
            step=int(data["step"]),
            rank=int(data.get("rank", -1)),
            signal=str(data.get("signal", "?")),
            deadline=float(deadline) if deadline is not None else None,
        )


def key_prefix() -> str:
    """Return the store key prefix of this job attempt.

    torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``) outlives worker restarts, so
    the restart count is part of the prefix there; ft-launcher gives every round a fresh store,
    where no attempt number is needed (restart counts are per node and could differ).

    Returns:
        The prefix, ending in ``/``.
    """
    prefix = "resiliency/emergency/"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        prefix += f"attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    return prefix


def default_store() -> Any:
    """Connect a client to the job's store at ``MASTER_ADDR:MASTER_PORT``.

    Under torchrun that is the agent's store; under ft-launcher and ``init_process_group`` with
    ``env://`` it is the store rank 0 hosts for the process group. Call it only once the process
    group is up (rank 0 may be the host).

    Returns:
        A ``torch.distributed.TCPStore`` client.

    Raises:
        RuntimeError: ``MASTER_ADDR`` or ``MASTER_PORT`` is not set.
    """
    addr = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise RuntimeError(
            "EmergencyCheckpoint needs the job's c10d store to agree on a stop step: pass "
            "store=... or set MASTER_ADDR and MASTER_PORT (torchrun and ft-launcher set them)"
        )
    return TCPStore(
        addr,
        int(port),
        is_master=False,
        timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
        wait_for_workers=False,
    )


class StopAgreement:
    """The store side of the emergency stop (see the module docstring).

    Args:
        store: a c10d ``Store`` shared by every rank, or None with a single rank.
        rank: this rank.
        world_size: number of ranks.
        prefix: key prefix of this job attempt.
    """

    def __init__(self, store: Any, rank: int, world_size: int, prefix: str) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self._stop_key = prefix + "stop_at"
        self._plan_key = prefix + "plan"
        self._done_key = prefix + "done"
        self._warned = False

    def propose(self, record: StopRecord) -> StopRecord:
        """Write ``record`` unless another rank was first; return the record every rank adopts.

        Args:
            record: this rank's proposal.

        Returns:
            The first proposal stored (``record`` itself when this rank won).
        """
        if self.store is None:
            return record
        raw = self.store.compare_set(self._stop_key, "", record.encode())
        return StopRecord.decode(raw)

    def poll(self) -> StopRecord | None:
        """Return the agreed stop if some rank proposed one, else None (one store round trip).

        A store error is logged (once) and reads as "no stop yet": the next check retries.
        """
        if self.store is None:
            return None
        # A flaky store (torch raises RuntimeError subclasses, sockets OSError) or a garbled
        # record must not kill the training loop; anything else is the rank's own failure.
        try:
            if not self.store.check([self._stop_key]):
                return None
            return StopRecord.decode(self.store.get(self._stop_key))
        except (RuntimeError, OSError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                logger.warning("emergency stop: checking the store failed (will retry): %s", exc)
            return None

    def agree_plan(self, plan: str) -> str:
        """Propose what to save at the stop step; return the plan every rank adopts (first wins).

        Args:
            plan: this rank's choice.

        Returns:
            The first plan stored.
        """
        if self.store is None:
            return plan
        raw = self.store.compare_set(self._plan_key, "", plan)
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def finish(self, timeout: float) -> bool:
        """Count this rank done; rank 0 waits (up to ``timeout``) until every rank is.

        Rank 0 usually hosts the store, so it leaves last and nobody loses the store mid-save.

        Args:
            timeout: how long rank 0 waits for the others.

        Returns:
            True when every rank reported done (always True on ranks other than 0).
        """
        if self.store is None:
            return True
        try:
            count = int(self.store.add(self._done_key, 1))
            if self.rank != 0:
                return True
            deadline = time.monotonic() + timeout
            while count < self.world_size:
                if time.monotonic() >= deadline:
                    logger.warning(
                        "emergency stop: %d of %d ranks reported done within %.1f s; leaving",
                        count,
                        self.world_size,
                        timeout,
                    )
                    return False
                time.sleep(0.02)
                count = int(self.store.add(self._done_key, 0))
        except Exception as exc:
            logger.warning("emergency stop: the done count failed: %s", exc)
            return False
        return True


def check_lead(lead: int, check_every: int | None = None, max_drift: int = 1) -> int:
    """Check the rule ``lead >= check_every + max_drift``; return the check period.

    Args:
        lead: steps between the first rank noticing and the stop step.
        check_every: store check period in steps (None: ``lead - max_drift``).
        max_drift: steps one rank's loop can run ahead of another's.

    Returns:
        The check period.

    Raises:
        ValueError: the rule does not hold (the stop step could be behind a rank).
    """
    if max_drift < 0:
        raise ValueError(f"max_drift must be >= 0, got {max_drift}")
    if check_every is None:
        check_every = lead - max_drift
    if check_every < 1 or lead < check_every + max_drift:
        raise ValueError(
            f"lead={lead} is too small: the stop step must stay ahead of every rank, which "
            f"needs lead >= check_every + max_drift (check_every={check_every}, "
            f"max_drift={max_drift}, check_every >= 1); use lead >= "
            f"{max(check_every, 1) + max_drift}"
        )
    return check_every
