"""Intents: the controller's decisions, written in the backend for a node's launcher to act on.

One key per node (``intents/<node>``) holds the latest intent. The controller writes it with
compare-and-set against the value it read, in one transaction that also checks the job's
generation (:mod:`resiliency.supervisor.generation`), so two controllers never overwrite each
other's decision unseen and a stale controller cannot write at all. An intent names its job,
node, generation, issuer and time; the launcher acts on one whose ``id`` is newer than the last
it acted on, only when :func:`refusal` finds nothing wrong with it, and reports that id back in
its next document (``intent_done``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from resiliency.supervisor.backend import Backend
from resiliency.supervisor.document import keys_for
from resiliency.supervisor.errors import StaleGenerationError, SupervisorError
from resiliency.supervisor.generation import Generation, claim_generation, read_generation

__all__ = ["ACTIONS", "Intent", "read_intent", "refusal", "write_intent"]

logger = logging.getLogger(__name__)

#: exclude: the node leaves the job (its launcher exits 4; a spare joins at the next rendezvous).
#: restart: the node's launcher restarts its workers (a new rendezvous round, not charged).
#: shutdown: the job stops on every node, no restarts (exit 3).
ACTIONS = ("exclude", "restart", "shutdown")


@dataclass(frozen=True)
class Intent:
    """A decision for one node.

    Attributes:
        id: increases with every intent for the node.
        node: the node it is for.
        action: one of :data:`ACTIONS`.
        policy: the policy that decided.
        reason: one line saying why.
        evidence: the samples the decision rests on.
        time: the controller's wall time of the decision.
        job: the job it is for (the namespace ``resiliency/<job>/``).
        generation: the job's generation its controller claimed.
        issuer: the controller that wrote it (``controller@HOST:PID``).
    """

    id: int
    node: str
    action: str
    policy: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)
    job: str = ""
    generation: int = 0
    issuer: str = ""

    def to_json(self) -> bytes:
        """Encode as compact JSON."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Intent:
        """Decode and check an intent.

        Raises:
            SupervisorError: not a valid intent.
        """
        try:
            intent = cls(**json.loads(data))
            if not isinstance(intent.id, int) or not isinstance(intent.generation, int):
                raise TypeError("id and generation must be integers")
        except (ValueError, TypeError) as exc:
            raise SupervisorError(f"invalid intent: {exc}") from exc
        if intent.action not in ACTIONS:
            raise SupervisorError(f"unknown intent action {intent.action!r}")
        return intent


def read_intent(backend: Backend, node: str) -> tuple[Intent | None, bytes | None]:
    """Return ``node``'s latest intent and its raw value (None, None when there is none).

    Raises:
        SupervisorError: the stored value is not a valid intent.
    """
    raw = backend.get(keys_for(backend.namespace).intent(node))
    if raw is None:
        return None, None
    return Intent.from_json(raw), raw


def refusal(intent: Intent, *, job: str, node: str, generation: Generation | None) -> str | None:
    """Why ``intent`` must not be acted on by ``node`` of ``job`` (None: it may be).

    Args:
        intent: the intent read from ``node``'s key.
        job: the reader's job.
        node: the reader's node.
        generation: the job's current generation (None: no controller claimed one).

    Returns:
        One line naming the mismatch, or None.
    """
    if intent.job != job:
        return f"it names job {intent.job!r}, this is job {job!r}"
    if intent.node != node:
        return f"it names node {intent.node!r}, this is node {node!r}"
    if generation is None:
        return (
            f"it claims generation {intent.generation} (issuer {intent.issuer!r}), but no "
            "controller ever claimed a generation of this job"
        )
    if intent.generation != generation.number:
        return (
            f"it was written for generation {intent.generation} by {intent.issuer!r}, but the "
            f"job is at generation {generation.number} (claimed by {generation.issuer}): a "
            "stale controller or a forged intent"
        )
    return None


def write_intent(  # noqa: PLR0917 - one argument per intent field
    backend: Backend,
    node: str,
    action: str,
    policy: str,
    reason: str,
    evidence: dict[str, Any],
    *,
    generation: Generation | None = None,
) -> Intent | None:
    """Write a new intent for ``node``: compare-and-set over the current one, guarded by the
    job's generation.

    Args:
        backend: the job's backend.
        node: the node it is for.
        action: one of :data:`ACTIONS`.
        policy: the deciding policy.
        reason: one line saying why.
        evidence: the samples the decision rests on.
        generation: the writer's claim (a :class:`~resiliency.supervisor.controller.Controller`
            passes its own). None: the job's current generation, claimed first when there is
            none; such a writer is not fenced against a newer controller.

    Returns:
        The intent written, or None when another writer changed the intent in between.

    Raises:
        StaleGenerationError: the job's generation is no longer ``generation``.
    """
    if generation is None:
        generation = read_generation(backend) or claim_generation(backend)
    key = keys_for(backend.namespace).intent(node)
    try:
        current, raw = read_intent(backend, node)
    except SupervisorError as exc:  # garbage in the key: replaced, and said so
        logger.warning("%s holds no valid intent (%s); it is replaced", key, exc)
        current, raw = None, backend.get(key)
    if current is not None and (
        why := refusal(current, job=backend.url.job, node=node, generation=generation)
    ):
        # Not this controller's: said, and overwritten (its id still counts, so ids only grow).
        logger.warning(
            "%s: intent %d is not this controller's (%s); replaced", key, current.id, why
        )
    intent = Intent(
        id=(current.id if current else 0) + 1,
        node=node,
        action=action,
        policy=policy,
        reason=reason,
        evidence=evidence,
        job=backend.url.job,
        generation=generation.number,
        issuer=generation.issuer,
    )
    guard = (keys_for(backend.namespace).generation, generation.raw)
    if backend.guarded_compare_and_set(key, raw, intent.to_json(), guard=guard):
        return intent
    latest = read_generation(backend)
    if latest is None or latest.raw != generation.raw:
        now = f"generation {latest.number} of {latest.issuer}" if latest else "no generation"
        raise StaleGenerationError(
            f"{generation.issuer} holds generation {generation.number} of job "
            f"{backend.url.job}, but the job now has {now}: a newer controller runs, this one "
            f"must not act (intent {action} for node {node} not written)"
        )
    return None
