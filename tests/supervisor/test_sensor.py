"""The sensor, the GPU watchdogs (fake pynvml), the controller, the status endpoint and CLI,
in one process against the real backends."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from resiliency.goodput import Recorder
from resiliency.supervisor import (
    Controller,
    DiagnosisPolicy,
    GpuHealthPolicy,
    GpuWatch,
    NodeSensor,
    NodeStatus,
    RankStatus,
    StragglerPolicy,
    SupervisorError,
    backend_from_url,
    keys_for,
    start_status_server,
    write_intent,
)
from resiliency.supervisor.cli import main as supervisor_main


def probe(state: str = "running", **extra):
    return lambda: {
        "state": state,
        "ranks": {0: RankStatus(0.25, "step")},
        "restarts": 1,
        "hangs": {"heartbeat": 2},
        **extra,
    }


def test_a_document_roundtrips_and_bad_ones_are_refused():
    doc = NodeStatus(
        "n",
        3,
        time.time(),
        1.0,
        "running",
        ranks={4: RankStatus(0.5, "fwd")},
        straggler={4: {"gpu": 0.5}},
    )
    assert NodeStatus.from_json(doc.to_json()) == doc
    for bad in (
        b"[]",
        b'{"v": 99}',
        b"{",
        json.dumps({**json.loads(doc.to_json()), "state": "zombie"}).encode(),
    ):
        with pytest.raises(SupervisorError):
            NodeStatus.from_json(bad)


def test_sensor_publishes_one_write_per_interval_and_receives_intents(backend_url: str):
    backend = backend_from_url(backend_url)
    got = []
    sensor = NodeSensor(
        backend, "n1", probe(), interval=0.3, gpu=False, ledger_dir="", on_intent=got.append
    )
    sensor.start()
    deadline = time.monotonic() + 10
    while sensor.latest is None:
        assert time.monotonic() < deadline, "the sensor published no first document"
        time.sleep(0.05)
    controller_side = backend_from_url(backend_url)
    intent = write_intent(controller_side, "n1", "restart", "test", "because", {"x": 1})
    assert intent is not None and intent.id == 1
    deadline = time.monotonic() + 10
    while not got:
        assert time.monotonic() < deadline, "the intent did not reach the sensor"
        time.sleep(0.05)
    assert got[0].action == "restart" and got[0].evidence == {"x": 1}
    before, seq0 = dict(backend.ops), sensor.latest.seq
    time.sleep(1.5)  # a steady stretch of five 0.3 s intervals, to count the writes made in it
    sensor.stop(final=False)
    writes = {
        op: n - before.get(op, 0) for op, n in backend.ops.items() if op in ("set", "put", "append")
    }
    published = sensor.latest.seq - seq0
    assert published >= 2
    assert sum(writes.values()) <= published + 1, (writes, published)  # one write per document
    doc = NodeStatus.from_json(controller_side.get(keys_for(backend.namespace).node("n1")))
    assert doc.state == "running" and doc.ranks[0].section == "step" and doc.intent_done == 1
    backend.close()
    controller_side.close()


def test_gpu_watch_reads_ecc_xid_and_throttle(fake_nvml: Path):
    fake_nvml.write_text(
        json.dumps({"count": 2, "ecc": {"1": 3}, "xid": {"0": [79]}, "throttle": {"0": 0x40 | 0x4}})
    )
    watch = GpuWatch()
    assert watch.available
    d0, d1 = watch.sample()
    assert (d0.xid, sorted(d0.throttle), d1.ecc_uncorrectable) == ([79], ["hw_thermal", "power"], 3)
    watch.close()


def test_gpu_watch_is_skipped_cleanly_without_a_driver(fake_nvml: Path):
    fake_nvml.write_text(json.dumps({"no_driver": True}))
    watch = GpuWatch()
    assert not watch.available and watch.sample() == []
    assert "NVML not available" in (watch.note or "")


def test_uncorrectable_ecc_excludes_the_node_at_once(backend_url: str, fake_nvml: Path, tmp_path):
    fake_nvml.write_text(json.dumps({"count": 1, "ecc": {"0": 1}}))
    backend = backend_from_url(backend_url)
    sensor = NodeSensor(backend, "bad", probe(), interval=0.5, gpu=GpuWatch(), ledger_dir="")
    rec = Recorder(tmp_path, job="j")
    controller = Controller(backend, [GpuHealthPolicy(), StragglerPolicy()], recorder=rec)
    sensor.publish_once()
    stats = controller.cycle()
    assert [(d.node, d.action, d.policy) for d in stats.decisions] == [
        ("bad", "exclude", "gpu_health")
    ]
    assert stats.intents[0].evidence["gpus"][0]["ecc_uncorrectable"] == 1
    assert sensor.check_intent(timeout=5).action == "exclude"
    sensor.publish_once()
    assert controller.cycle().intents == []  # told once
    rec.close()
    lines = [json.loads(x) for p in tmp_path.glob("*.jsonl") for x in p.read_text().splitlines()]
    (event,) = [e for e in lines if e["event"] == "supervisor_decision"]
    assert event["policy"] == "gpu_health" and event["target"] == "bad"
    backend.close()


def test_status_endpoint_serves_prometheus_text():
    latest = NodeStatus(
        "n",
        1,
        time.time(),
        1.0,
        "running",
        ranks={3: RankStatus(0.5, "fwd")},
        step=42,
        restarts=2,
        hangs={"heartbeat": 1},
        straggler={3: {"individual": 0.8}},
        checkpoint_age=12.5,
    )
    server = start_status_server(lambda: latest, 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        server.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("resiliency_heartbeat_age_seconds", (("rank", "3"),))] == 0.5
    assert samples[("resiliency_open_section", (("rank", "3"), ("section", "fwd")))] == 1
    assert samples[("resiliency_last_step", ())] == 42
    assert samples[("resiliency_restarts_total", ())] == 2
    assert samples[("resiliency_hangs_total", (("timer", "heartbeat"),))] == 1
    assert samples[("resiliency_straggler_score", (("kind", "individual"), ("rank", "3")))] == 0.8
    assert samples[("resiliency_checkpoint_age_seconds", ())] == 12.5


def test_status_cli_prints_every_node_and_marks_stale_rows(backend_url: str, capsys):
    backend = backend_from_url(backend_url)
    keys = keys_for(backend.namespace)
    fresh = NodeStatus("a", 5, time.time(), 1.0, "running", ranks={0: RankStatus(0.1, "step")})
    stale = NodeStatus("b", 9, time.time() - 3.0, 1.0, "restarting")
    backend.put(keys.node("a"), fresh.to_json(), ttl=30)
    backend.put(keys.node("b"), stale.to_json(), ttl=30)
    write_intent(backend, "b", "exclude", "straggler", "slow", {})
    assert supervisor_main(["status", backend_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["NODE", "STATE"]
    assert lines[1].startswith("a ") and "0:0.1s/step" in lines[1] and "STALE" not in lines[1]
    assert lines[2].startswith("b (STALE)") and "exclude#1" in lines[2]
    backend.close()


def test_launcher_diagnoses_reach_the_controller_through_the_ledger(
    backend_url: str, tmp_path: Path, caplog
):
    """Two launchers on one host share its ledger file: each node's sensor publishes its own
    launcher's verdicts only, and the controller excludes the GPU culprit that a names on b."""
    ledger = tmp_path / "ledger"
    backend = backend_from_url(backend_url)
    ledger.mkdir()
    groups = {"a": 0, "b": 1}
    ranks = {"a": {0: RankStatus()}, "b": {1: RankStatus()}}
    # What each launcher's probe says: running in the round, then restarting after it failed.
    states = {"a": "running", "b": "running"}

    def node_probe(node: str):
        def sample() -> dict:
            running = states[node] == "running"
            group = groups[node] if running else None
            return {"state": states[node], "group_rank": group, "ranks": ranks[node]}

        return sample

    sensors = {
        node: NodeSensor(
            backend, node, node_probe(node), interval=0.5, gpu=False, ledger_dir=str(ledger)
        )
        for node in groups
    }
    decisions = Recorder(tmp_path / "controller", job="j")
    controller = Controller(backend, [DiagnosisPolicy()], recorder=decisions)
    for sensor in sensors.values():
        sensor.publish_once()
    assert controller.cycle().decisions == []  # running: a is group rank 0, b group rank 1

    # The launchers' recorders (rank None), named by group rank as the launcher names them.
    launchers = {}
    for node in ("a", "b"):
        launchers[node] = Recorder(ledger, job="j", rank=None)
        launchers[node].rename(str(groups[node]))
    launchers["a"].emit(
        "diagnosis",
        cls="gpu_hardware",
        culprit_ranks=[1],
        culprit_nodes=["1"],
        decision="restart",
        evidence={"cause": "Xid 79: GPU has fallen off the bus", "rule": "gpu_error"},
        rule="restart",
        cycle=0,
    )
    launchers["b"].emit(
        "diagnosis",
        cls="crash",
        culprit_ranks=[1],
        culprit_nodes=["1"],
        decision="restart",
        evidence={"cause": "exited with code 1"},
        rule="restart",
        cycle=0,
    )
    for rec in launchers.values():
        rec.close()
    with open(next(ledger.glob("*.jsonl")), "a") as fh:  # a torn line from a crashed writer
        fh.write('{"event": "diagnosis", "rank": null, "node": "0", "cls"\n')

    states.update(a="restarting", b="restarting")  # the round ended
    docs = {node: sensor.publish_once() for node, sensor in sensors.items()}
    assert [(d["cls"], d["seq"]) for d in docs["a"].diagnoses] == [("gpu_hardware", 1)]
    assert [(d["cls"], d["cause"]) for d in docs["b"].diagnoses] == [
        ("crash", "exited with code 1")
    ]
    with caplog.at_level("INFO", logger="resiliency.supervisor.policies"):
        stats = controller.cycle()
    assert [(d.node, d.action, d.policy) for d in stats.decisions] == [
        ("b", "exclude", "diagnosis")
    ]
    reason = stats.decisions[0].reason
    assert "diagnosis by node a's launcher: gpu_hardware (ranks 1, nodes 1): Xid 79" in reason
    assert "diagnosis of node b's launcher (cycle 0): crash (ranks 1, nodes 1)" in caplog.text
    intent = sensors["b"].check_intent(timeout=5)
    assert intent is not None and intent.action == "exclude" and intent.policy == "diagnosis"
    # The next documents carry the same verdicts: nothing new is decided.
    for sensor in sensors.values():
        sensor.publish_once()
    assert controller.cycle().decisions == []
    decisions.close()
    backend.close()
