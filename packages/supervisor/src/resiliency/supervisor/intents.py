"""Intents: the controller's decisions, written in the backend for a node's launcher to act on.

One key per node (``intents/<node>``) holds the latest intent. The controller writes it with
compare-and-set against the value it read, so two controllers never overwrite each other's
decision unseen; the launcher acts on an intent whose ``id`` is newer than the last it acted on
and reports that id back in its next document (``intent_done``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from resiliency.supervisor.backend import Backend
from resiliency.supervisor.document import keys_for
from resiliency.supervisor.errors import SupervisorError

__all__ = ["ACTIONS", "Intent", "read_intent", "write_intent"]

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
    """

    id: int
    node: str
    action: str
    policy: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

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


def write_intent(  # noqa: PLR0917 - one argument per intent field
    backend: Backend, node: str, action: str, policy: str, reason: str, evidence: dict[str, Any]
) -> Intent | None:
    """Write a new intent for ``node`` (compare-and-set over the current one).

    Returns:
        The intent written, or None when another writer changed the key in between.
    """
    current, raw = read_intent(backend, node)
    intent = Intent(
        id=(current.id if current else 0) + 1,
        node=node,
        action=action,
        policy=policy,
        reason=reason,
        evidence=evidence,
    )
    key = keys_for(backend.namespace).intent(node)
    if backend.compare_and_set(key, raw, intent.to_json()):
        return intent
    return None
