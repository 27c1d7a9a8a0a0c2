"""The job-wide hang verdict: every node's evidence through a real TCPStore, bounded waits."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import timedelta
from typing import cast

import pytest
from round_store import RoundStores
from torch.distributed import TCPStore

from resiliency.launcher import _job_verdict as job_verdict
from resiliency.launcher._cycle import Cycle
from resiliency.launcher._diagnosis import HangDiagnosis
from resiliency.launcher._job_verdict import (
    JobHangExchange,
    decode_evidence,
    decode_verdict,
    encode_evidence,
    encode_verdict,
)
from resiliency.launcher._monitors import MonitorSet
from resiliency.launcher._shared_state import SharedRoundState
from resiliency.launcher.verdict import Frame, analyze_hang, judge_frames

_ALL_REDUCE = (
    "Current thread 0x00007f48f25f4b80 (most recent call first):\n"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
    "line 3252 in all_reduce\n"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", '
    "line 83 in wrapper\n"
    '  File "/job/train.py", line 56 in main\n'
    '  File "/job/train.py", line 67 in <module>\n'
)


class _Monitors:
    """Stands in for the node's monitors: every stack-dump request is accepted."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def request_stack_dump(self, local_rank: int) -> bool:
        self.asked.append(local_rank)
        return True


def _exchange(round_stores: RoundStores, node: int, wait_s: float = 5.0) -> JobHangExchange:
    # Each node has its own connection, as separate launchers do.
    assert round_stores.round is not None
    return JobHangExchange(SharedRoundState(round_stores.round.clone(), world=2, rank=node), wait_s)


def _cycle(monitors: _Monitors, ranks: dict[int, int]) -> Cycle:
    diagnosis = HangDiagnosis(cast(MonitorSet, monitors), dump_timeout=0.5, grace_period=1.0)
    return Cycle(diagnosis, ranks=ranks, connected=set(ranks))


def test_evidence_round_trip_and_malformed_evidence() -> None:
    frames: dict[int, Frame | None] = {2: Frame("/a/t.py", 7, "step"), 3: None}
    assert decode_evidence(encode_evidence(1, 0, frames)) == (1, frames)
    for bad in (
        '["x"]',
        '{"node": "1", "ranks": {}}',
        '{"node": 1}',
        '{"node": 1, "ranks": {"0": {"file": "a"}}}',
        "{" + " " * (1 << 20) + "}",
    ):
        with pytest.raises(ValueError):
            decode_evidence(bad)


def test_both_nodes_name_the_stopped_rank_of_the_other_node(round_stores: RoundStores) -> None:
    # Node 1's rank 1 was stopped: its monitor found it hung and got no dump.
    node1 = _exchange(round_stores, 1)
    node1.announce()
    local1 = analyze_hang({1: None})
    assert local1.culprits == ()  # alone, node 1 cannot tell what rank 1 was doing
    assert node1.contribute(_cycle(_Monitors(), {0: 1}), lambda: None, local=local1, restart=0)

    # Node 0 had no hang of its own: it asks its monitors for its rank's stack first.
    node0 = _exchange(round_stores, 0)
    assert node0.hang_in_round()
    monitors = _Monitors()
    cycle0 = _cycle(monitors, {0: 0})

    def poll() -> None:  # the monitor's answer arrives as an event
        cycle0.diagnosis.add_stacks(0, _ALL_REDUCE)

    assert node0.contribute(cycle0, poll, local=None, restart=0)
    assert monitors.asked == [0]
    summaries = {node.judge().summary for node in (node0, node1)}
    assert summaries == {
        "job-wide hang verdict: rank 0 stuck at all_reduce (distributed_c10d.py:3252); "
        "no stack dump from rank 1 -> likely culprit: rank 1 (node 1)"
    }
    # One contribution per round.
    assert not node0.contribute(cycle0, poll, local=None, restart=0)


def test_no_hang_in_the_round_publishes_nothing(round_stores: RoundStores) -> None:
    node0 = _exchange(round_stores, 0)
    assert not node0.hang_in_round()
    monitors = _Monitors()
    assert not node0.contribute(_cycle(monitors, {0: 0}), lambda: None, local=None, restart=0)
    assert monitors.asked == []


def test_a_silent_node_bounds_the_wait_and_is_logged(
    round_stores: RoundStores, caplog: pytest.LogCaptureFixture
) -> None:
    node0 = _exchange(round_stores, 0, wait_s=0.3)
    node0.announce()
    local = analyze_hang({0: _ALL_REDUCE})
    assert node0.contribute(_cycle(_Monitors(), {0: 0}), lambda: None, local=local, restart=0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="resiliency.launcher._job_verdict"):
        verdict = node0.judge()
    assert time.monotonic() - started < 5
    assert "no evidence from node(s) 1" in caplog.text
    assert "for every node's hang evidence" in caplog.text
    assert verdict.culprits == ()
    assert verdict.summary == (
        "job-wide hang verdict: rank 0 stuck at all_reduce (distributed_c10d.py:3252)"
    )


def test_malformed_evidence_is_dropped_and_logged(
    round_stores: RoundStores, caplog: pytest.LogCaptureFixture
) -> None:
    assert round_stores.round is not None
    round_stores.round.set("ft/hang/evidence/1", "not json")
    node0 = _exchange(round_stores, 0)
    node0.announce()
    local = analyze_hang({0: _ALL_REDUCE})
    assert node0.contribute(_cycle(_Monitors(), {0: 0}), lambda: None, local=local, restart=0)
    with caplog.at_level(logging.ERROR, logger="resiliency.launcher._job_verdict"):
        verdict = node0.judge()
    assert "dropped node 1's evidence" in caplog.text
    assert verdict.by_frame and verdict.culprits == ()


def test_the_verdict_round_trips_and_a_malformed_one_is_refused() -> None:
    verdict = judge_frames(
        {0: Frame("/t/torch/distributed/c10d.py", 9, "all_reduce"), 1: None, 2: None},
        {0: 0, 1: 1, 2: 1},
        label="job-wide hang verdict",
    )
    back = decode_verdict(encode_verdict(verdict))
    assert (back.by_frame, back.common_frame, back.culprits, back.no_dump, back.summary) == (
        verdict.by_frame,
        verdict.common_frame,
        verdict.culprits,
        verdict.no_dump,
        verdict.summary,
    )
    assert back.nodes == {1: 1, 2: 1}  # the nodes of the ranks it names, not every rank's
    for bad in ("[]", '{"by_frame": [[["a", "x", "f"], [0]]]}', "{"):
        with pytest.raises(ValueError):
            decode_verdict(bad)


def test_without_node_0s_verdict_a_node_judges_the_evidence_itself(
    round_stores: RoundStores, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_verdict, "VERDICT_SLACK_S", 0.2)
    node1 = _exchange(round_stores, 1, wait_s=0.3)
    node1.announce()
    local = analyze_hang({1: None})
    assert node1.contribute(_cycle(_Monitors(), {0: 1}), lambda: None, local=local, restart=0)
    # node 0 published its evidence but never judges (its launcher died after publishing)
    node0 = _exchange(round_stores, 0)
    assert node0.contribute(
        _cycle(_Monitors(), {0: 0}), lambda: None, local=analyze_hang({0: _ALL_REDUCE}), restart=0
    )
    with caplog.at_level(logging.WARNING, logger="resiliency.launcher._job_verdict"):
        verdict = node1.judge()
    assert "node 0's job-wide hang verdict" in caplog.text
    assert verdict.culprits == (1,) and verdict.nodes[1] == 1


def test_a_store_gone_with_its_host_is_logged_and_the_node_judges_alone(caplog) -> None:
    # The scored run (issue 28): node 0 lost; node 1's launcher died on the round's store.
    server = subprocess.Popen(
        [sys.executable, "-c", _STORE_HOST], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        exchange = JobHangExchange(SharedRoundState(client, world=2, rank=1), 1.0)
        server.kill()
        server.wait(10)
        exchange.announce()
        assert not exchange.contribute(
            _cycle(_Monitors(), {0: 1}), lambda: None, local=analyze_hang({1: None}), restart=0
        )
    finally:
        server.kill()
        server.wait(10)
        server.stdout.close()
    assert "the round's store is unreachable" in caplog.text
    assert "cannot announce the hang" in caplog.text


_STORE_HOST = (
    "import sys, time\n"
    "from torch.distributed import TCPStore\n"
    "store = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
    "print(store.port, flush=True)\n"
    "time.sleep(600)\n"
)
