"""Policies as unit tests: hysteresis, stale samples, evidence."""

from __future__ import annotations

import time

import pytest

from resiliency.supervisor import (
    GpuDevice,
    GpuHealthPolicy,
    NodeLostPolicy,
    NodeStatus,
    NodeView,
    Observation,
    PolicyError,
    RankStatus,
    RepeatedFailurePolicy,
    StragglerPolicy,
    load_policies,
)


def status(node: str, seq: int, ranks: tuple[int, ...] = (), **fields) -> NodeStatus:
    fields.setdefault("state", "running")
    return NodeStatus(
        node=node,
        seq=seq,
        time=time.time(),
        interval=1.0,
        ranks={r: RankStatus() for r in ranks},
        **fields,
    )


def obs(*views: NodeView, lost: dict | None = None) -> Observation:
    return Observation({v.status.node: v for v in views}, lost or {}, ttl=2.0)


def report(seq: int, scores: dict[int, float], rseq: int) -> Observation:
    """Node a (ranks 0, 1; it reports for everyone) and node b (ranks 2, 3)."""
    a = status(
        "a",
        seq,
        (0, 1),
        straggler_seq=rseq,
        straggler={r: {"individual": s} for r, s in scores.items()},
    )
    return obs(NodeView(a, new=True), NodeView(status("b", seq, (2, 3)), new=True))


def test_straggler_needs_n_reports_in_a_row():
    p = StragglerPolicy(threshold=0.7, consecutive=3)
    assert p.decide(report(1, {0: 1.0, 2: 0.5}, 1)) == []
    assert p.decide(report(2, {0: 1.0, 2: 0.4}, 2)) == []
    (d,) = p.decide(report(3, {0: 1.0, 3: 0.6}, 3))
    assert (d.node, d.action, d.policy) == ("b", "exclude", "straggler")
    assert [r["score"] for r in d.evidence["reports"]] == [0.5, 0.4, 0.6]
    assert d.evidence["reports"][-1]["rank"] == 3


def test_one_good_report_resets_the_count():
    p = StragglerPolicy(threshold=0.7, consecutive=3)
    p.decide(report(1, {2: 0.5}, 1))
    p.decide(report(2, {2: 0.5}, 2))
    assert p.decide(report(3, {2: 0.9}, 3)) == []
    assert p.decide(report(4, {2: 0.5}, 4)) == []
    assert p.decide(report(5, {2: 0.5}, 5)) == []
    assert len(p.decide(report(6, {2: 0.5}, 6))) == 1


def test_a_stale_sample_read_again_never_counts_twice():
    p = StragglerPolicy(threshold=0.7, consecutive=2)
    first = report(1, {2: 0.1}, 1)
    assert p.decide(first) == []
    # The same document again (its seq did not move): not a new sample.
    same = Observation({n: NodeView(v.status, new=False) for n, v in first.nodes.items()})
    assert p.decide(same) == []
    # A new sample that carries no new report (straggler_seq unchanged) does not count either.
    assert p.decide(report(2, {2: 0.1}, 1)) == []
    assert len(p.decide(report(3, {2: 0.1}, 2))) == 1


def test_a_sample_older_than_max_age_is_not_acted_on():
    p = GpuHealthPolicy(max_age=5.0)
    old = status("a", 1, (0,), gpu=[GpuDevice(0, ecc_uncorrectable=1)])
    old.time -= 60
    assert p.decide(obs(NodeView(old, new=True))) == []


def test_gpu_ecc_or_critical_xid_excludes_at_once():
    p = GpuHealthPolicy()
    ok = status("a", 1, (0,), gpu=[GpuDevice(0), GpuDevice(1, xid=[13])])  # 13: app error
    assert p.decide(obs(NodeView(ok, new=True))) == []
    bad = status("a", 2, (0,), gpu=[GpuDevice(0), GpuDevice(1, ecc_uncorrectable=2)])
    (d,) = p.decide(obs(NodeView(bad, new=True)))
    assert d.action == "exclude" and "uncorrectable ECC" in d.reason
    assert d.evidence["gpus"] == [{"gpu": 1, "ecc_uncorrectable": 2, "xid": []}]
    xid = status("a", 3, (0,), gpu=[GpuDevice(0, xid=[79])])
    (d,) = p.decide(obs(NodeView(xid, new=True)))
    assert "XID [79]" in d.reason
    # From the host daemon's document too, while the launcher's is not new.
    host = status("a", 9, state="host", gpu=[GpuDevice(0, ecc_uncorrectable=1)])
    (d,) = p.decide(obs(NodeView(status("a", 3, (0,)), new=False, host=host, host_new=True)))
    assert d.node == "a"


def test_repeated_failure_stops_the_job_after_k_same_causes():
    p = RepeatedFailurePolicy(consecutive=3)
    f = [
        {"attempt": 0, "cause": "hang:heartbeat"},
        {"attempt": 1, "cause": "peer"},
        {"attempt": 2, "cause": "hang:heartbeat"},
    ]
    assert p.decide(obs(NodeView(status("a", 1, failures=f), new=True))) == []
    f2 = [*f, {"attempt": 3, "cause": "exit:1"}]
    assert p.decide(obs(NodeView(status("a", 2, failures=f2), new=True))) == []
    f3 = [*f, {"attempt": 3, "cause": "hang:heartbeat"}]
    (d,) = p.decide(obs(NodeView(status("a", 3, failures=f3), new=True)))
    assert d.action == "shutdown" and "hang:heartbeat" in d.reason
    assert len(d.evidence["failures"]) == 3
    # Once per failure: the same list again decides nothing.
    assert p.decide(obs(NodeView(status("a", 4, failures=f3), new=True))) == []


def test_node_lost_restarts_the_running_survivors_only():
    p = NodeLostPolicy()
    dead = status("b", 7, (1,))
    survivors = obs(
        NodeView(status("a", 3, (0,)), new=True),
        NodeView(status("c", 3, state="waiting"), new=True),
        lost={"b": dead},
    )
    (d,) = p.decide(survivors)
    assert (d.node, d.action) == ("a", "restart")
    assert d.evidence["lost"]["b"]["last_seq"] == 7 and d.evidence["ttl_s"] == 2.0
    # A node that left on purpose (excluded) is not lost.
    gone = obs(
        NodeView(status("a", 4, (0,)), new=True), lost={"b": status("b", 8, state="excluded")}
    )
    assert p.decide(gone) == []


def test_load_policies(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        "interval: 0.5\npolicies:\n  straggler: {threshold: 0.8, consecutive: 2}\n"
        "  gpu_health: {xids: [79]}\n"
    )
    policies, interval = load_policies(path)
    assert interval == 0.5 and [p.name for p in policies] == ["straggler", "gpu_health"]
    assert policies[1].xids == frozenset({79})
    with pytest.raises(PolicyError, match="unknown policy 'stragler'"):
        load_policies({"policies": {"stragler": {}}})
    with pytest.raises(PolicyError, match="unexpected keyword"):
        load_policies({"policies": {"straggler": {"treshold": 1}}})
    assert len(load_policies(None)[0]) == 4
