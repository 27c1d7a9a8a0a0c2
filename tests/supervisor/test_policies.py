"""Policies as unit tests: hysteresis, stale samples, evidence."""

from __future__ import annotations

import time

import pytest

from resiliency.supervisor import (
    DiagnosisPolicy,
    GpuDevice,
    GpuHealthPolicy,
    NodeLostPolicy,
    NodeStatus,
    NodeView,
    Observation,
    PolicyError,
    RankStatus,
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


def verdict(seq: int, cls: str, decision: str, nodes: list[str], **extra) -> dict:
    return {
        "seq": seq,
        "cycle": seq - 1,
        "cls": cls,
        "culprit_ranks": [1],
        "culprit_nodes": nodes,
        "decision": decision,
        "rule": extra.pop("rule", None),
        "cause": extra.pop("cause", "RuntimeError: boom"),
    }


def test_diagnosis_excludes_the_gpu_culprit_another_node_named():
    p = DiagnosisPolicy()
    # While running, a is group rank 0 and b group rank 1.
    running = obs(
        NodeView(status("a", 1, (0,), group_rank=0), new=True),
        NodeView(status("b", 1, (1,), group_rank=1), new=True),
    )
    assert p.decide(running) == []
    # a's launcher blames b's GPU (a job-wide verdict); b is restarting by then.
    gpu = verdict(1, "gpu_hardware", "restart", ["1"], cause="Xid 79: GPU fell off the bus")
    failed = obs(
        NodeView(status("a", 2, state="restarting", diagnoses=[gpu]), new=True),
        NodeView(status("b", 2, state="restarting"), new=True),
    )
    (d,) = p.decide(failed)
    assert (d.node, d.action, d.policy) == ("b", "exclude", "diagnosis")
    assert "diagnosis by node a's launcher: gpu_hardware (ranks 1, nodes 1): Xid 79" in d.reason
    assert d.evidence["diagnosed_by"] == "a" and d.evidence["cls"] == "gpu_hardware"
    # The same verdict read again (the next documents carry it too) decides nothing.
    again = obs(NodeView(status("a", 3, state="restarting", diagnoses=[gpu]), new=True))
    assert p.decide(again) == []


def test_diagnosis_leaves_the_launchers_own_decisions_to_them(caplog):
    p = DiagnosisPolicy()
    p.decide(obs(NodeView(status("a", 1, (0,), group_rank=0), new=True)))
    # The culprit's own launcher takes its node out: no second decision.
    own = verdict(1, "gpu_hardware", "restart_without_node", ["0"])
    doc = status("a", 2, state="restarting", diagnoses=[own])
    assert p.decide(obs(NodeView(doc, new=True))) == []
    # A crash the launcher restarts, then stops (its repeated-failure rule): logged, no intent.
    crash = verdict(2, "crash", "restart", ["0"])
    stop = verdict(3, "crash", "stop", ["0"], rule="repeated")
    with caplog.at_level("INFO", logger="resiliency.supervisor.policies"):
        doc = status("a", 3, state="restarting", diagnoses=[own, crash, stop])
        assert p.decide(obs(NodeView(doc, new=True))) == []
    stops = "node a's launcher stops the job (rule repeated): crash (ranks 1, nodes 0)"
    assert stops in caplog.text
    assert "diagnosis of node a's launcher (cycle 1): crash" in caplog.text
    # A culprit no running node had: logged, not acted on.
    stray = verdict(4, "gpu_hardware", "restart", ["7"])
    doc = status("a", 4, state="restarting", diagnoses=[stray])
    assert p.decide(obs(NodeView(doc, new=True))) == []
    assert "names node 7 (group rank) as culprit" in caplog.text
    # A new launcher process on node a counts its verdicts from 1 again: read, not skipped.
    p.decide(obs(NodeView(status("b", 1, (1,), group_rank=1), new=True)))
    fresh = verdict(1, "gpu_hardware", "restart", ["1"])
    doc = status("a", 1, state="restarting", pid=4242, diagnoses=[fresh])
    b = status("b", 2, state="restarting")
    (d,) = p.decide(obs(NodeView(doc, new=True), NodeView(b, new=True)))
    assert d.node == "b"


def test_diagnosis_exclude_classes_are_configurable():
    p = DiagnosisPolicy(exclude_classes=["hang_io"])
    p.decide(obs(NodeView(status("b", 1, (1,), group_rank=1), new=True)))
    gpu = verdict(1, "gpu_hardware", "restart", ["1"])
    io = verdict(2, "hang_io", "restart", ["1"], cause="read_shard")
    doc = status("a", 1, state="restarting", diagnoses=[gpu, io])
    b = status("b", 2, state="restarting")
    (d,) = p.decide(obs(NodeView(doc, new=True), NodeView(b, new=True)))
    assert d.node == "b" and "hang_io" in d.reason
    with pytest.raises(PolicyError, match="list of failure classes"):
        DiagnosisPolicy(exclude_classes="gpu_hardware")  # type: ignore[arg-type]


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
    (diag,), _ = load_policies({"policies": {"diagnosis": {"exclude_classes": ["gpu_hardware"]}}})
    assert diag.exclude_classes == frozenset({"gpu_hardware"})
    # The supervisor's own repeated-failure rules are gone: an old policy file says what to do.
    with pytest.raises(PolicyError, match="--ft-max-no-progress-cycles"):
        load_policies({"policies": {"repeated_failure": {"consecutive": 3}}})
