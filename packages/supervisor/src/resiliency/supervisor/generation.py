"""The job's generation: a fencing number each controller claims when it starts.

``resiliency/<job>/generation`` holds ``{"generation": N, "issuer": "...", "time": T}``. A
controller claims N+1 with compare-and-set when it starts and writes every intent in a
transaction that also checks the key still holds its claim (:meth:`Backend.
guarded_compare_and_set`). A controller left over from an earlier run, or one that lost its
network and came back, holds an older number: its writes fail, it learns it is stale
(:class:`~resiliency.supervisor.errors.StaleGenerationError`) and stops. Launchers check an
intent's generation against the key too, so an intent written outside a controller with the
wrong number is refused and logged.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass

from resiliency.supervisor.backend import Backend
from resiliency.supervisor.document import keys_for
from resiliency.supervisor.errors import BackendError, SupervisorError

__all__ = ["Generation", "claim_generation", "default_issuer", "read_generation"]

logger = logging.getLogger(__name__)

#: Claims lost to other controllers in a row before giving up.
_MAX_CLAIM_TRIES = 20


@dataclass(frozen=True)
class Generation:
    """One claim of the job's generation.

    Attributes:
        number: the generation (1 for the job's first controller).
        issuer: who claimed it (``controller@HOST:PID`` by default).
        time: the claimer's wall time.
        raw: the stored value, compared byte for byte by the guarded writes.
    """

    number: int
    issuer: str
    time: float
    raw: bytes

    @classmethod
    def from_raw(cls, raw: bytes, key: str) -> Generation:
        """Decode the stored value of ``key``.

        Raises:
            SupervisorError: not a generation record.
        """
        try:
            doc = json.loads(raw)
            number = int(doc["generation"])
            return cls(number, str(doc["issuer"]), float(doc["time"]), raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise SupervisorError(f"{key} holds no valid generation record: {exc}") from None


def default_issuer() -> str:
    """``controller@HOST:PID``: names this process in intents and logs."""
    return f"controller@{socket.gethostname()}:{os.getpid()}"


def read_generation(backend: Backend) -> Generation | None:
    """The job's current generation (None: no controller ever claimed one).

    Raises:
        SupervisorError: the key holds something else.
    """
    key = keys_for(backend.namespace).generation
    raw = backend.get(key)
    return None if raw is None else Generation.from_raw(raw, key)


def claim_generation(backend: Backend, issuer: str | None = None) -> Generation:
    """Claim the next generation of the job for ``issuer`` (compare-and-set over the current).

    Args:
        backend: the job's backend.
        issuer: who claims (None: :func:`default_issuer`).

    Returns:
        The claimed generation.

    Raises:
        BackendError: the claim lost to other writers too many times in a row.
    """
    who = issuer or default_issuer()
    key = keys_for(backend.namespace).generation
    for _ in range(_MAX_CLAIM_TRIES):
        current = read_generation(backend)
        number = (current.number if current else 0) + 1
        raw = json.dumps(
            {"generation": number, "issuer": who, "time": time.time()}, sort_keys=True
        ).encode()
        if backend.compare_and_set(key, current.raw if current else None, raw):
            if current is not None:
                logger.warning(
                    "%s claims generation %d of job %s; %s (generation %d) can no longer act",
                    who,
                    number,
                    backend.url.job,
                    current.issuer,
                    current.number,
                )
            else:
                logger.info("%s claims generation 1 of job %s", who, backend.url.job)
            return Generation(number, who, json.loads(raw)["time"], raw)
    raise BackendError(
        f"{who} could not claim a generation of job {backend.url.job} at {key}: "
        f"{_MAX_CLAIM_TRIES} other claims in a row won (are controllers restarting in a loop?)"
    )
