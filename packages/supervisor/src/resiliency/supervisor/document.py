"""What a node publishes (one compact JSON document per interval) and where the keys live.

Key layout, under the backend's namespace ``resiliency/<job>/``:

- ``nodes/<node>``: the node's :class:`NodeStatus`, put with a ttl of 2 intervals by the
  launcher's sensor (one write per interval);
- ``hosts/<node>``: the same document from ``resiliency-host-daemon`` (GPU health that must
  outlive the launcher);
- ``intents/<node>``: the controller's latest :class:`~resiliency.supervisor.intents.Intent`
  for that node;
- ``generation``: the generation the newest controller claimed
  (:mod:`resiliency.supervisor.generation`).

Every key of a job is under its namespace, so one etcd role on that prefix is all a job needs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from resiliency.supervisor.errors import SupervisorError

__all__ = ["DOC_VERSION", "NODE_STATES", "GpuDevice", "NodeStatus", "RankStatus", "keys_for"]

DOC_VERSION = 1
NODE_STATES = ("waiting", "running", "restarting", "standby", "excluded", "stopped", "host")
MAX_DOC_BYTES = 64 * 1024


@dataclass(frozen=True)
class Keys:
    """The keys of one job."""

    namespace: str

    @property
    def nodes(self) -> str:
        """Prefix of the nodes' documents."""
        return self.namespace + "nodes/"

    @property
    def hosts(self) -> str:
        """Prefix of the host daemons' documents."""
        return self.namespace + "hosts/"

    @property
    def intents(self) -> str:
        """Prefix of the intents."""
        return self.namespace + "intents/"

    @property
    def generation(self) -> str:
        """Key of the job's generation (the newest controller's claim)."""
        return self.namespace + "generation"

    def node(self, node: str) -> str:
        """Key of ``node``'s document."""
        return self.nodes + node

    def host(self, node: str) -> str:
        """Key of ``node``'s host-daemon document."""
        return self.hosts + node

    def intent(self, node: str) -> str:
        """Key of ``node``'s intent."""
        return self.intents + node


def keys_for(namespace: str) -> Keys:
    """Return the key layout under ``namespace`` (``Backend.namespace``)."""
    return Keys(namespace)


@dataclass
class RankStatus:
    """One local rank as its launcher sees it.

    Attributes:
        hb_age: seconds since its last heartbeat (None: none yet, or unknown).
        section: the innermost open section (None: none open).
    """

    hb_age: float | None = None
    section: str | None = None


@dataclass
class GpuDevice:
    """One GPU's health watchdogs.

    Attributes:
        index: the NVML device index.
        ecc_uncorrectable: volatile uncorrectable ECC errors since the driver loaded.
        xid: XID error codes seen since the sensor started (most recent last).
        throttle: active clock-throttle reasons ("thermal", "power", ...).
    """

    index: int
    ecc_uncorrectable: int = 0
    xid: list[int] = field(default_factory=list)
    throttle: list[str] = field(default_factory=list)


@dataclass
class NodeStatus:
    """The document a node publishes every interval.

    Attributes:
        node: the node's id.
        seq: increases by one every publication (a sample with the same seq is not new).
        time: the writer's wall time of the sample.
        interval: the writer's publication interval, seconds.
        state: one of :data:`NODE_STATES`.
        host: the host name.
        pid: the writer's pid.
        group_rank: the node's rank in the current rendezvous round (None: not in one).
        ranks: global rank -> :class:`RankStatus` of this node's workers.
        step: the last training step seen (None: unknown).
        restarts: worker-group restarts on this node.
        hangs: hangs detected, by timer.
        straggler_seq: straggler reports seen so far (a new report increments it).
        straggler: the latest report: rank -> {kind: score} (1.0 = as fast as expected).
        gpu: the GPUs' health (empty when NVML is not available).
        gpu_note: why the GPU watchdogs are off, when they are.
        checkpoint_age: seconds since the last committed checkpoint (None: none seen).
        failures: the last cycle failures, oldest first: {"attempt": n, "cause": "hang:heartbeat"}.
        diagnoses: the launcher's latest verdicts on failed cycles (its ``diagnosis`` events of
            the goodput ledger), oldest first: {"seq", "cycle", "cls", "culprit_ranks",
            "culprit_nodes" (group ranks), "decision", "rule", "cause"}.
        intent_done: id of the last intent this node acted on.
    """

    node: str
    seq: int
    time: float
    interval: float
    state: str
    host: str = ""
    pid: int = 0
    group_rank: int | None = None
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    step: int | None = None
    restarts: int = 0
    hangs: dict[str, int] = field(default_factory=dict)
    straggler_seq: int = 0
    straggler: dict[int, dict[str, float]] = field(default_factory=dict)
    gpu: list[GpuDevice] = field(default_factory=list)
    gpu_note: str | None = None
    checkpoint_age: float | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    diagnoses: list[dict[str, Any]] = field(default_factory=list)
    intent_done: int = 0

    def to_json(self) -> bytes:
        """Encode compactly (sorted keys; rank keys as strings)."""
        doc = asdict(self)
        doc["v"] = DOC_VERSION
        doc["ranks"] = {str(k): v for k, v in doc["ranks"].items()}
        doc["straggler"] = {str(k): v for k, v in doc["straggler"].items()}
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> NodeStatus:
        """Decode and check a document.

        Raises:
            SupervisorError: not a valid document of a supported version.
        """
        if len(data) > MAX_DOC_BYTES:
            raise SupervisorError(f"node document of {len(data)} bytes is too large")
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("v") != DOC_VERSION:
                raise SupervisorError(f"unsupported node document version {doc.get('v')!r}")
            doc.pop("v")
            doc["ranks"] = {int(k): RankStatus(**v) for k, v in doc.get("ranks", {}).items()}
            doc["straggler"] = {
                int(k): {str(kind): float(s) for kind, s in v.items()}
                for k, v in doc.get("straggler", {}).items()
            }
            doc["gpu"] = [GpuDevice(**d) for d in doc.get("gpu", [])]
            status = cls(**doc)
        except SupervisorError:
            raise
        except (ValueError, TypeError, AttributeError) as exc:
            raise SupervisorError(f"invalid node document: {exc}") from exc
        if status.state not in NODE_STATES:
            raise SupervisorError(f"invalid node state {status.state!r}")
        return status
