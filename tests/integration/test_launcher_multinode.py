"""Two ft-launcher processes on loopback act as two nodes through torch's c10d rendezvous."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from resiliency.goodput import read_ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ft_launcher"))

from launcher_harness import (
    FAST_FT_FLAGS,
    WORKER,
    Launcher,
    free_port,
    kill_leftovers,
    markers,
    wait_for_markers,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def marker_dir(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


@pytest.fixture
def two_nodes(tmp_path: Path, marker_dir: Path):
    """Start two launchers of one job; everything is killed at teardown."""
    started: list[Launcher] = []

    def start(
        nnodes: str, worker_args: list[str], *flags: str, worker: Path = WORKER
    ) -> tuple[Launcher, Launcher]:
        """Node A starts first and hosts the rendezvous store; the fault fires on node B.

        Each node writes its exit status to node-a.json / node-b.json in ``tmp_path``.
        """
        port = free_port()
        common = [
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"job-{port}",
            "--rdzv-conf",
            # With --nnodes 1:2, node A forms a round alone once the last call ends: it must
            # outlast node B's start (importing torch took 13-25 s at load 8-16 here, and 10 s
            # was missed under 4 xdist workers). A round completes as soon as both joined; only
            # the rounds after B is gone wait the whole last call.
            "join_timeout=90,last_call_timeout=30,keep_alive_interval=1,keep_alive_max_attempt=2",
            "--local-addr",
            "127.0.0.1",
            "--max-restarts",
            "2",
            *FAST_FT_FLAGS,
            *flags,
        ]
        script = [str(worker), "--marker-dir", str(marker_dir), *worker_args]

        def node(name: str, fault: str) -> Launcher:
            status = ["--exit-status-file", str(tmp_path / f"node-{name}.json")]
            args = [*common, *status, *script]
            return Launcher(args, tmp_path / f"node-{name}.log", env={"FT_TEST_FAULT_NODE": fault})

        node_a = node("a", "0")
        started.append(node_a)
        # A's store exists once it logs its set-up line: B is then surely not the store host
        # (torch's c10d rendezvous cannot outlive the node hosting its store).
        node_a.wait_for_log("worker(s) on this node", 120)
        node_b = node("b", "1")
        started.append(node_b)
        return node_a, node_b

    yield start
    for launcher in started:
        launcher.kill()
    kill_leftovers(marker_dir)


def _both_joined(a: Launcher, b: Launcher) -> None:
    for node in (a, b):
        node.wait_for_log("of 2, fresh worker store", 120)


def test_failure_on_one_node_restarts_both(two_nodes, marker_dir: Path):
    a, b = two_nodes("2", ["--mode", "crash", "--steps", "40"])
    assert a.wait(240) == 0, a.log()
    assert b.wait(240) == 0, b.log()
    assert "restarting the worker group (rank" in b.log()  # the failed node restarts ...
    assert "re-forming the worker group: 1 node(s) failed" in a.log()  # ... the healthy follows
    # Markers are start-<rank>-<the node's restart count>-<pid>. The failed node's rank starts
    # again in attempt 1; the healthy node re-forms without a restart of its own. Not "each rank
    # started twice": on a busy machine node B's rank can crash before node A's first rank has
    # started at all (seen at load ~6: 3 start markers).
    starts = markers(marker_dir, "start")
    assert {m.split("-")[1] for m in starts} == {"0", "1"}, starts
    assert any(m.split("-")[2] == "1" for m in starts), starts
    assert len(markers(marker_dir, "done")) == 2


def test_min_healthy_keeps_the_healthy_node_going(two_nodes, marker_dir: Path):
    a, b = two_nodes(
        "1:2",
        ["--mode", "crash", "--steps", "40"],
        "--restart-policy",
        "min-healthy",
    )
    _both_joined(a, b)
    assert a.wait(240) == 0, a.log()
    assert b.wait(240) == 0, b.log()
    assert "standing by" in b.log() and "finished_on_healthy_nodes" in b.log()
    assert "re-forming" not in a.log() and "restarting" not in a.log()
    # A's rank ran once and finished; B's rank crashed and was not restarted.
    assert len(markers(marker_dir, "done")) == 1
    assert len(markers(marker_dir, "start")) == 2


def test_shutdown_workload_stops_every_node_without_restart(two_nodes, marker_dir: Path):
    a, b = two_nodes("2", ["--mode", "wlc_shutdown", "--steps", "400"])
    _both_joined(a, b)
    assert a.wait(240) == 3, a.log()
    assert b.wait(240) == 3, b.log()
    logs = a.log() + b.log()
    assert "requested ShutdownWorkload: injected: stop" in logs
    assert "restarting" not in logs and "re-forming" not in logs
    # Node B's rank may ask for the shutdown before node A's rank has even started (nothing
    # orders the two nodes' spawns): what matters is that no rank ever started a second time.
    starts = markers(marker_dir, "start")
    assert starts and all(name.split("-")[2] == "0" for name in starts), starts


def test_exclude_this_node_lets_the_other_node_go_on(two_nodes, marker_dir: Path):
    a, b = two_nodes("1:2", ["--mode", "wlc_exclude", "--steps", "60"])
    _both_joined(a, b)
    assert b.wait(240) == 4, b.log()
    assert a.wait(240) == 0, a.log()
    assert "requested ExcludeThisNode: injected: bad node" in b.log()
    assert "of 1, fresh worker store" in a.log()  # re-formed alone
    assert len(markers(marker_dir, "done")) == 1


# The healthy rank must never look hung: at 1.5 s (the harness's fast setting) a rank that got no
# CPU for that long on a loaded 2-core machine did, and the verdict then named no culprit. The
# faulted rank hangs for good, so a longer limit costs only a few seconds.
_PATIENT_HEARTBEAT = ("--ft-rank-heartbeat-timeout", "6")


def _wait_for_the_fault(marker_dir: Path) -> int:
    """Wait for both ranks to start, then for the faulty rank's fault; returns that rank.

    Two deadlines, each naming its stage: at load ~12 on this 2-core machine a rank took 24 s to
    import torch, and a single 40 s wait from the launchers' start to the fault ran out before
    node A's rank had started. Once both started, the fault comes at step 3 of the job.
    """
    wait_for_markers(marker_dir, "start", 2, 120)
    stopped = wait_for_markers(marker_dir, "stopped", 1, 60)[0]
    return int(stopped.split("-")[1])  # one rank per node: its rank is its node rank


@pytest.mark.parametrize("fault", ["stop", "gil_sleep"])
def test_a_rank_stopped_on_one_node_is_named_job_wide(
    two_nodes, marker_dir: Path, tmp_path: Path, fault: str
):
    # Node B's rank stops (SIGSTOP: no stack dump) or sleeps in C holding the GIL while node
    # A's rank waits for it in all_reduce; each node alone sees only its own rank hung.
    worker = Path(WORKER).parent / "collective_hang_worker.py"
    a, b = two_nodes("2", ["--fault", fault], *_PATIENT_HEARTBEAT, worker=worker)
    culprit = _wait_for_the_fault(marker_dir)
    # Hang detection (6 s), then the restart: two more torch imports (24 s each at load ~12).
    assert a.wait(240) == 0, a.log()
    assert b.wait(240) == 0, b.log()
    # The fault must last until the monitor kills the rank: a rank that went on past it (a signal
    # ended its sleep) let its peer leave the collective, and the verdict judged no real hang.
    assert not markers(marker_dir, "resumed"), (markers(marker_dir, "resumed"), b.log())
    named = f"-> likely culprit: rank {culprit} (node {culprit})"
    failures: list[str] = []
    for name, node in (("a", a), ("b", b)):
        lines = [ln for ln in node.log().splitlines() if "job-wide hang verdict:" in ln]
        assert len(lines) == 1 and named in lines[0], node.log()
        status = json.loads((tmp_path / f"node-{name}.json").read_text())
        assert any(named in v for v in status["hang_verdicts"]), status
        failures += status["failures"]
    # The node(s) that restarted because of the hang (whichever monitor fired first; the other
    # node re-forms) give the culprit as the root cause, not the rank whose timer expired.
    assert failures, "no node restarted"
    for failure in failures:
        assert failure.startswith(f"likely culprit of the hang: rank {culprit} (node {culprit}")
    assert len(markers(marker_dir, "done")) == 2


def test_a_node_blocked_in_a_read_is_the_diagnosed_culprit(
    two_nodes, marker_dir: Path, tmp_path: Path
):
    # Issue 28: node B's rank blocks in a read of a stalled file (a FIFO nobody writes) while
    # node A's rank waits for it in all_reduce. The diagnosis names node B and its rank, class
    # hang_io, and only node B (the culprit's node) records it.
    worker = Path(WORKER).parent / "collective_hang_worker.py"
    ledger = tmp_path / "ledger"
    a, b = two_nodes(
        "2", ["--fault", "read"], "--goodput-dir", str(ledger), *_PATIENT_HEARTBEAT, worker=worker
    )
    culprit = _wait_for_the_fault(marker_dir)
    assert a.wait(240) == 0, a.log()
    assert b.wait(240) == 0, b.log()
    diagnoses = [e for e in read_ledger([ledger]).events if e.event == "diagnosis"]
    # who wrote what first: the launchers' logs are long and pytest cuts the message
    seen = [(e.node, e.data.get("cycle"), e.data.get("cls"), e.time) for e in diagnoses]
    # The hang's cycle is diagnosed once, by one node. A later cycle may fail for a reason of its
    # own on a loaded machine (a restarted rank that missed the gloo deadline): its diagnosis is
    # not this test's.
    assert diagnoses, ("no diagnosis event", a.log()[-6000:], b.log()[-6000:])
    first = min(e.data.get("cycle", 0) for e in diagnoses)
    events = [e for e in diagnoses if e.data.get("cycle", 0) == first]
    assert len(events) == 1, (seen, a.log()[-6000:], b.log()[-6000:])
    (event,) = events
    assert event.data["cls"] == "hang_io", event.data
    assert event.data["culprit_ranks"] == [culprit]
    assert event.data["culprit_nodes"] == [str(culprit)]
    assert event.node == str(culprit)  # written by the culprit's node
    assert event.data["decision"] == "restart"
    assert "read_shard" in event.data["evidence"]["cause"]
    line = f"diagnosis: hang_io (ranks {culprit}, nodes {culprit}): hung at read_shard"
    assert line in (b.log() if culprit == 1 else a.log())
