"""The job-wide failure verdict (issue 28): every node's evidence through a real round store.

Node 1's rank 2 is killed; node 0's ranks fail a few milliseconds later in their all-reduce
("Connection closed by peer"). Judged alone, node 0 would blame its own ranks; with both nodes'
evidence the one verdict names rank 2 on node 1, and node 1 (the culprit's node) records it. A
node that sends nothing is a lost node; a node preempted by the scheduler says so before it goes.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from round_store import RoundStores
from torch.distributed import PrefixStore, TCPStore

from resiliency.launcher._job_failure import (
    JobFailureExchange,
    JobFailureVerdict,
    decode_cycle_evidence,
    encode_cycle_evidence,
    publish_preempted,
)
from resiliency.launcher._shared_state import SharedRoundState
from resiliency.launcher.failure_classes import (
    CycleEvidence,
    FailureClass,
    RankEvidence,
    classify,
)

LOST_PEER = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"


def _peer_lost(rank: int, node: int) -> RankEvidence:
    return RankEvidence(
        rank=rank,
        node=node,
        exitcode=1,
        exc_type="RuntimeError",
        message=LOST_PEER,
        stopped_by_launcher=False,
    )


def _node0() -> CycleEvidence:
    return CycleEvidence(node=0, attempt=0, ranks={0: _peer_lost(0, 0), 1: _peer_lost(1, 0)})


def _node1() -> CycleEvidence:
    killed = RankEvidence(rank=2, node=1, exitcode=-9, stopped_by_launcher=False)
    stopped = RankEvidence(rank=3, node=1, exitcode=-15, stopped_by_launcher=True)
    return CycleEvidence(node=1, attempt=0, ranks={2: killed, 3: stopped})


def _exchange(stores: RoundStores, node: int, world: int = 2, wait_s: float = 10.0):
    assert stores.server is not None
    client = TCPStore(
        "127.0.0.1", stores.server.port, is_master=False, timeout=timedelta(seconds=30)
    )
    shared = SharedRoundState(PrefixStore("round/", client), world=world, rank=node)
    return JobFailureExchange(shared, wait_s), shared


def _both(stores: RoundStores, evidence: dict[int, CycleEvidence]) -> dict[int, JobFailureVerdict]:
    verdicts: dict[int, JobFailureVerdict] = {}
    errors: list[BaseException] = []

    def run(node: int) -> None:
        try:
            exchange, _ = _exchange(stores, node)
            verdicts[node] = exchange.verdict(evidence[node])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in evidence]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return verdicts


def test_alone_node_0_would_blame_its_own_ranks():
    alone = classify(_node0())
    assert (alone.cls, alone.culprit_ranks) == (FailureClass.CRASH, (0, 1))


def test_the_killed_rank_on_the_other_node_is_named_once_by_both(round_stores: RoundStores):
    verdicts = _both(round_stores, {0: _node0(), 1: _node1()})
    for job in verdicts.values():
        assert job.verdict.cls is FailureClass.SIGNAL
        assert job.verdict.culprit_ranks == (2,) and job.verdict.culprit_nodes == (1,)
        assert job.verdict.cause == "killed by SIGKILL"
        assert job.recorder == 1  # the culprit's node records and decides
    assert verdicts[0].to_json() == verdicts[1].to_json()


def test_a_node_that_sends_nothing_is_lost(round_stores: RoundStores, caplog):
    exchange, _ = _exchange(round_stores, 0, wait_s=1.0)
    job = exchange.verdict(_node0())
    assert job.verdict.cls is FailureClass.NODE_LOST
    assert job.verdict.culprit_nodes == (1,) and job.verdict.culprit_ranks == ()
    assert job.recorder == 0
    assert "no evidence from node(s) 1" in caplog.text


def test_a_preempted_node_is_named_and_records_its_own_verdict(round_stores: RoundStores):
    _, shared1 = _exchange(round_stores, 1)
    preempted = CycleEvidence(
        node=1, attempt=0, preempted="the launcher of node 1 got SIGTERM", preempted_nodes=(1,)
    )
    publish_preempted(shared1, preempted)
    exchange, _ = _exchange(round_stores, 0, wait_s=5.0)
    job = exchange.verdict(_node0())
    assert job.verdict.cls is FailureClass.PREEMPTION
    assert job.verdict.culprit_nodes == (1,)
    assert job.recorder == 1  # it recorded its preemption itself before it stopped


def test_without_node_0s_verdict_a_node_judges_itself(round_stores: RoundStores, caplog):
    exchange, _ = _exchange(round_stores, 1, wait_s=0.5)
    job = exchange.verdict(_node1())
    assert (job.verdict.culprit_ranks, job.recorder) == ((2,), 1)
    assert "node 0's failure verdict" in caplog.text


def test_evidence_round_trips_and_malformed_evidence_is_refused():
    evidence = _node1()
    assert decode_cycle_evidence(encode_cycle_evidence(evidence)) == evidence
    for bad in ('{"node": 1}', '{"ranks": [{"rank": 1, "nodes": 2}]}', "[]", "x" * (1 << 21)):
        with pytest.raises(ValueError):
            decode_cycle_evidence(bad)


def test_a_dead_monitor_and_a_failed_health_check_have_their_classes():
    dead = classify(CycleEvidence(node=1, attempt=0, dead_monitors=(3,)))
    assert (dead.cls, dead.culprit_ranks, dead.culprit_nodes) == (FailureClass.MONITOR, (3,), (1,))
    sick = classify(CycleEvidence(node=1, attempt=0, health=("disk: /scratch is read-only",)))
    assert (sick.cls, sick.culprit_nodes) == (FailureClass.NODE_HEALTH, (1,))
    assert "read-only" in sick.cause
