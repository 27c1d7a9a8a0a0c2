"""Real ft-launchers on loopback as nodes, a real controller, a real TCPStore (and etcd)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
from jobs import INTERVAL, Job, status_table
from launcher_harness import worker_pids
from prometheus_client.parser import text_string_to_metric_families

from resiliency.supervisor import Intent, backend_from_url, keys_for

pytestmark = pytest.mark.slow

EXPECTED_METRICS = {
    "resiliency_heartbeat_age_seconds",
    "resiliency_open_section",
    "resiliency_last_step",
    "resiliency_restarts",  # the text format names the counter resiliency_restarts_total
    "resiliency_hangs",
    "resiliency_straggler_score",
    "resiliency_checkpoint_age_seconds",
}


@pytest.fixture
def job_factory(tmp_path: Path):
    jobs: list[Job] = []

    def make(*args, **kwargs) -> Job:
        job = Job(tmp_path / f"job{len(jobs)}", *args, **kwargs)
        jobs.append(job)
        return job

    (tmp_path / "job0").mkdir()
    yield make
    for job in jobs:
        job.cleanup()


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _wait_running(job: Job, nodes: list[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    table = ""
    while time.monotonic() < deadline:
        table = status_table(job.url)
        rows = [line for line in table.splitlines()[1:] if line.split()[1:2] == ["running"]]
        if sorted(r.split()[0] for r in rows) == sorted(nodes):
            return table
        time.sleep(0.3)
    raise AssertionError(f"nodes {nodes} not all running; status:\n{table}")


def _slow_node_scenario(job: Job) -> None:
    a = job.start_node("a")
    controller = job.start_controller()
    b = job.start_node("b", slow=True)
    _wait_running(job, ["a", "b"])
    c = job.start_node("c")  # the spare: --nnodes 2:2, it waits in the rendezvous
    # The status CLI shows every node: a and b running, the spare c waiting. Waited for as a
    # whole: on a loaded machine c's launcher takes long to start, and a row whose sample came
    # late is marked "(STALE)" until the next one, so a first snapshot can show either.
    expected = {"a": "running", "b": "running", "c": "waiting"}
    deadline = time.monotonic() + 120
    while True:
        table = status_table(job.url)
        rows = {line.split()[0]: line.split()[1] for line in table.splitlines()[1:]}
        if rows == expected or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert rows == expected, f"waited 120 s for {expected} in the status table:\n{table}"

    # The status endpoint during the run: valid Prometheus text with every metric. A sample
    # can fall between two steps (no section open for an instant, longer on a loaded machine):
    # scraped until one shows rank 0 inside its step.
    port = job.status_port("a")
    deadline = time.monotonic() + 60
    while True:
        metrics = _scrape(port)
        if (
            metrics.get("resiliency_straggler_score")
            and metrics.get("resiliency_last_step")
            and metrics.get("resiliency_open_section")
        ):
            break
        assert time.monotonic() < deadline, f"no straggler score / step / section: {metrics}"
        time.sleep(0.3)
    assert set(metrics) >= EXPECTED_METRICS, sorted(metrics)
    assert metrics["resiliency_heartbeat_age_seconds"][0].labels == {"rank": "0"}
    assert metrics["resiliency_open_section"][0].labels["section"] == "step"

    # Inject the fault: b's worker turns three times slower.
    (job.markers / "inject-slow").touch()

    # b is slow three reports in a row: excluded (exit 4), the spare joins, training goes on.
    assert b.wait(90) == 4, b.log()
    assert "supervisor (straggler): 3 straggler reports in a row below 0.7" in b.log()
    match = controller.wait_for_log(
        r"supervisor decision: exclude node b \(policy straggler\)"
        r".*; evidence: (\{.*\})",
        10,
    )
    evidence = json.loads(match.group(1))
    assert len(evidence["reports"]) == 3 and all(r["score"] < 0.7 for r in evidence["reports"])
    # The spare joins a round of two and training goes on: rank 1 (now on c) makes progress.
    c.wait_for_log("of 2, fresh worker store", 90)
    left_at = job.progress(1)
    _wait_for(lambda: job.progress(1) > left_at + 10, 90, "rank 1 made no progress on c")
    job.finish()
    assert a.wait(120) == 0, a.log()
    assert c.wait(120) == 0, c.log()
    done = sorted(p.name.rsplit("-", 1)[0] for p in job.markers.glob("done-*"))
    assert done == ["done-0", "done-1"], done
    (decision,) = [d for d in job.decisions() if d["target"] == "b"]
    assert decision["action"] == "exclude" and decision["policy"] == "straggler"
    assert decision["evidence"]["threshold"] == 0.7


def test_slow_node_is_excluded_and_the_spare_joins(job_factory):
    _slow_node_scenario(job_factory("2:2", "tcp"))


def _secure_url(secure_etcd, monkeypatch: pytest.MonkeyPatch, job: str) -> str:
    """Job ``job`` on the TLS + RBAC etcd, configured the etcdctl way: ETCDCTL_CACERT, _CERT,
    _KEY and _USER (a user whose only role is the job's prefix) in the environment of the
    launchers, the controller and the status CLI; the URL names only the endpoint and job."""
    user, password = secure_etcd.add_job(job)
    client = secure_etcd.pki.clients["job-a"]
    monkeypatch.setenv("ETCDCTL_CACERT", str(secure_etcd.pki.ca))
    monkeypatch.setenv("ETCDCTL_CERT", str(client.cert))
    monkeypatch.setenv("ETCDCTL_KEY", str(client.key))
    monkeypatch.setenv("ETCDCTL_USER", f"{user}:{password}")
    return f"etcd://127.0.0.1:{secure_etcd.port}/{job}"


# On etcd the scenario runs over TLS + RBAC only: plain etcd is the same launcher and controller
# path with no certificates (~30 s again); its connection is tested in test_backend.py, and end
# to end by the repeated-failure test below.
def test_slow_node_is_excluded_and_the_spare_joins_on_tls_etcd(
    job_factory, secure_etcd, monkeypatch
):
    url = _secure_url(secure_etcd, monkeypatch, f"tls-{os.getpid()}")
    job = job_factory("2:2", url)
    _slow_node_scenario(job)
    for node in ("a", "b", "c"):
        log = job.tmp / f"node-{node}.log"
        assert f"supervisor: node {node} publishes to {url}" in log.read_text(), node
    assert "TLS, CA" in job.controller.log() and f"user resiliency-tls-{os.getpid()}" in (
        job.controller.log()
    )


def test_a_launcher_refuses_a_forged_intent_and_trains_on(job_factory, secure_etcd, monkeypatch):
    """A shutdown intent written into the job's key with a stale generation, over TLS + RBAC:
    the real launcher logs its refusal and keeps training."""
    name = f"forged-{os.getpid()}"
    url = _secure_url(secure_etcd, monkeypatch, name)
    job = job_factory("1", url)
    a = job.start_node("a")
    controller = job.start_controller()
    controller.wait_for_log(r"acts for job forged-\d+ as generation 1", 60)
    _wait_running(job, ["a"])
    root = backend_from_url(secure_etcd.root_url(name))
    forged = Intent(7, "a", "shutdown", "forged", "stop it", job=name, generation=0)
    root.put(keys_for(root.namespace).intent("a"), forged.to_json())
    root.close()
    a.wait_for_log(  # a substring, not a pattern
        f"refusing intent 7 (shutdown) for node a at resiliency/{name}/intents/a: it was written "
        "for generation 0 by '', but the job is at generation 1 (claimed by controller@",
        60,
    )
    before = job.progress(0)
    _wait_for(lambda: job.progress(0) > before + 10, 90, "rank 0 stopped after the forged intent")
    job.finish()
    assert a.wait(120) == 0, a.log()
    assert not job.decisions()  # the controller decided nothing; the forgery was not acted on


def test_uncorrectable_ecc_excludes_the_node_at_once(job_factory):
    job = job_factory("1:2", "tcp")
    a = job.start_node("a")
    controller = job.start_controller()
    b = job.start_node("b", ecc=True)
    assert b.wait(90) == 4, b.log()
    job.finish()
    match = controller.wait_for_log(
        r"supervisor decision: exclude node b \(policy gpu_health\): GPU 0: 2 uncorrectable ECC"
        r"; evidence: (\{.*\})",
        10,
    )
    evidence = json.loads(match.group(1))
    assert evidence["gpus"] == [{"gpu": 0, "ecc_uncorrectable": 2, "xid": []}]
    assert len([d for d in job.decisions() if d["policy"] == "gpu_health"]) == 1  # at once, once
    assert a.wait(120) == 0, a.log()


# tcp and TLS etcd: a plain etcd case re-ran the TLS one's lease and liveness path without the
# certificates (~20 s); plain etcd's leases are tested in test_backend.py.
@pytest.mark.parametrize("engine", ["tcp", "etcd-tls"])
def test_a_killed_launcher_is_seen_and_the_job_restarts_on_the_rest(
    job_factory, engine, request, monkeypatch
):
    url = "tcp"
    if engine == "etcd-tls":
        secure = request.getfixturevalue("secure_etcd")
        url = _secure_url(secure, monkeypatch, f"kill-tls-{os.getpid()}")
    job = job_factory("1:2", url)
    a = job.start_node("a")
    controller = job.start_controller()
    b = job.start_node("b")
    _wait_running(job, ["a", "b"])
    # Only a node the controller saw running can be found lost.
    controller.wait_for_log(r"node a: running", 120)
    controller.wait_for_log(r"node b: running", 120)
    # The node dies: its launcher, its monitors and its worker, all with SIGKILL.
    b_workers = [
        pid
        for pid in worker_pids(job.markers)
        if f"start-1-{pid}" in {p.name for p in job.markers.glob("start-1-*")}
    ]
    killed_at = time.time()
    os.killpg(b.proc.pid, signal.SIGKILL)
    for pid in b_workers:
        os.kill(pid, signal.SIGKILL)
    match = controller.wait_for_log(
        r"supervisor decision: restart node a \(policy node_lost\): node\(s\) b lost"
        r".*; evidence: (\{.*\})",
        30,
    )
    evidence = json.loads(match.group(1))
    decision = next(d for d in job.decisions() if d["policy"] == "node_lost")
    seen_after = _iso(decision["time"]) - killed_at
    print(
        f"{engine}: node loss seen {seen_after:.2f} s after SIGKILL (interval {INTERVAL} s, "
        f"ttl {evidence['ttl_s']} s)"
    )
    # Expected: the ttl (2 intervals; etcd rounds a lease up to 2 s) past its last document,
    # plus a controller cycle; the bound is 10x that.
    assert evidence["ttl_s"] == 2 * INTERVAL
    assert seen_after < 10 * (max(2 * INTERVAL, 2.0) + INTERVAL)
    a.wait_for_log("restarting the workers", 120)
    a.wait_for_log("of 1, fresh worker store", 90)  # re-formed on the remaining node
    before = job.progress(0)
    _wait_for(lambda: job.progress(0) > before + 10, 90, "rank 0 made no progress after restart")
    job.finish()
    assert a.wait(120) == 0, a.log()


@pytest.mark.parametrize("engine", ["tcp", "etcd"])
def test_a_repeated_failure_is_stopped_once_by_the_launcher_and_named_by_the_supervisor(
    job_factory, engine, request
):
    """The launcher's stop rule at its default (3 failures without progress) and the
    supervisor's diagnosis policy: one decision (the launcher's exit 6), no supervisor shutdown,
    and the controller's log names the launcher's verdicts it read from the node's document."""
    if engine == "etcd":
        url = request.getfixturevalue("etcd_server").url(f"repeat-{os.getpid()}")
        job = job_factory("1", url)
    else:
        job = job_factory("1", "tcp")
    a = job.start_node("a", worker_args=("--fail-at-step", "5"))
    controller = job.start_controller()
    assert a.wait(240) == 6, a.log()  # stopped by the launcher, long before 8 restarts ran out
    assert "stopped_repeated" in a.log() and "consecutive attempts" in a.log(), a.log()
    assert "ValueError: bad batch at step 5" in a.log()  # the repeated error is named
    assert "restarts: 8" not in a.log()
    # The supervisor read the launcher's verdicts (the failed attempts before the stop at least)
    # from a's documents, and named them in its log.
    controller.wait_for_log(
        r"diagnosis of node a's launcher \(cycle \d+\): crash \(ranks 0, nodes 0\): "
        r"ValueError: bad batch at step 5",
        30,
    )
    # One owner: the launcher decided; the supervisor wrote no intent of its own.
    assert "supervisor decision:" not in controller.log()
    assert job.decisions() == []
    assert "supervisor (" not in a.log()
    verdicts = [
        json.loads(line)
        for path in job.goodput.glob("*.jsonl")
        for line in path.read_text().splitlines()
        if '"diagnosis"' in line
    ]
    verdicts = [v for v in verdicts if v["event"] == "diagnosis"]
    assert [v["decision"] for v in verdicts][-1] == "stop", verdicts
    assert {v["cls"] for v in verdicts} == {"crash"} and verdicts[-1]["rule"] == "repeated"


def test_a_gpu_verdict_takes_its_node_out_once_and_the_spare_joins(job_factory):
    """b's rank fails with an Xid: b's own launcher diagnoses GPU hardware on its node and
    leaves (exit 4); the supervisor names the verdict and adds no exclude of its own."""
    job = job_factory("2:2", "tcp")
    a = job.start_node("a")
    controller = job.start_controller()
    # "slow" marks the faulty node for the worker: its rank raises at step 20 of its run.
    b = job.start_node("b", slow=True, worker_args=("--gpu-error-at-step", "40"))
    _wait_running(job, ["a", "b"])
    c = job.start_node("c")  # the spare, waiting in the rendezvous
    assert b.wait(180) == 4, b.log()
    assert "gpu_hardware" in b.log(), b.log()
    # b's rank and node numbers are those it drew in the rendezvous (b can join before a on a
    # loaded machine): one rank per node, so the culprit rank is the culprit node.
    controller.wait_for_log(
        r"diagnosis of node b's launcher \(cycle \d+\): gpu_hardware \(ranks (\d+), nodes \1\)"
        r": .*Xid 79.*; its decision: restart_without_node",
        30,
    )
    c.wait_for_log("of 2, fresh worker store", 120)
    left_at = job.progress(1)
    _wait_for(lambda: job.progress(1) > left_at + 10, 90, "rank 1 made no progress on c")
    assert "supervisor decision:" not in controller.log()  # one decision: b's launcher's
    job.finish()
    assert a.wait(120) == 0, a.log()
    assert c.wait(120) == 0, c.log()


def _wait_for(condition, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def _iso(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_the_failure_verdict_is_exchanged_through_etcd(job_factory, etcd_server):
    """With ``--supervisor etcd://`` the two nodes exchange their failure evidence and node 0's
    verdict in etcd, under the job's ``verdicts/<round id>/`` (issue 28: "on the supervisor's
    backend when one is configured"), not in the round's TCPStore; the verdict is the same."""
    job = job_factory("2", etcd_server.url(f"exchange-{os.getpid()}"))
    a = job.start_node("a", worker_args=("--fail-at-step", "5"))
    b = job.start_node("b", worker_args=("--fail-at-step", "5"))
    # Rank 0 raises the same ValueError in every attempt: the stop rule ends the job.
    codes = {a.wait(240), b.wait(240)}
    assert 6 in codes, (a.log(), b.log())
    logs = a.log() + b.log()
    rounds = set(re.findall(r"job-wide verdicts exchanged in \S+ under verdicts/(\w+)/", logs))
    assert rounds, logs
    backend = backend_from_url(job.url)
    try:
        found = []
        for round_id in rounds:
            raw = backend.get(f"{backend.namespace}verdicts/{round_id}/ft/failure/verdict")
            if raw is not None:
                found.append(json.loads(raw))
                for node in (0, 1):  # both nodes' evidence, in the same round
                    key = f"{backend.namespace}verdicts/{round_id}/ft/failure/evidence/{node}"
                    assert backend.get(key) is not None, (round_id, node)
    finally:
        backend.close()
    assert found, f"no failure verdict in etcd under rounds {sorted(rounds)}"
    for verdict in found:
        assert verdict["cls"] == "crash" and verdict["culprit_ranks"] == [0], verdict
        assert "ValueError" in verdict["cause"], verdict
