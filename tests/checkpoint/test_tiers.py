"""Local + persistent tiers on real 2-process gloo jobs (one rank per node, GROUP_RANK per process).

Local every step (replicated to the other node), persistent every 5 steps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiers_harness import Cluster, free_port

pytestmark = pytest.mark.slow


def test_replica_restore_permuted_nodes_and_persistent_fallback(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    first = c.run(12)
    assert all(r["restored"] is None for r in first.values())
    for node in (0, 1):  # keep_last=2; each node holds both shards (own + the peer's replica)
        assert c.committed(node) == {11: [0, 1], 12: [0, 1]}
    assert c.persistent_steps() == [5, 10]

    # A replaced node 1 (empty local dir): rank 1 restores from node 0's replica, step 12.
    c.wipe(1)
    second = c.run(14)
    assert [second[r]["restored"] for r in (0, 1)] == [12, 12]
    assert second[0]["tier"] == "local" and second[1]["tier"] == "replica"
    assert second[0]["identical"] and second[1]["identical"]
    assert c.committed(1) == {13: [0, 1], 14: [0, 1]}  # re-replicated by the new saves

    # Node ranks permuted: the process on node0-local is now rank 1, and vice versa.
    third = c.run(16, order=(1, 0))
    assert [third[r]["restored"] for r in (0, 1)] == [14, 14]
    assert third[0]["identical"] and third[1]["identical"]

    # Every local copy lost: the persistent tier (step 15) restores.
    c.wipe(0)
    c.wipe(1)
    fourth = c.run(17)
    assert [fourth[r]["restored"] for r in (0, 1)] == [15, 15]
    assert {fourth[r]["tier"] for r in (0, 1)} == {"persistent"}
    assert fourth[0]["identical"] and fourth[1]["identical"]


def test_corrupt_replica_falls_back_to_an_older_step_whole(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.run(12)
    shard = tmp_path / "node0-local" / "step_000000012" / "shard_1"
    data = next(p for p in shard.iterdir() if p.name.endswith(".distcp"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    c.wipe(1)  # the owner of shard 1 lost its own copy
    second = c.run(13)
    # Step 12 cannot be assembled (shard 1's only copy is corrupt): every rank takes step 11.
    assert [second[r]["restored"] for r in (0, 1)] == [11, 11]
    assert second[1]["tier"] == "replica"
    assert second[0]["identical"] and second[1]["identical"]
    assert "corrupt" in c.logs("job2")


def test_a_corrupt_own_copy_is_caught_while_loading_and_the_replica_restores(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path)
    c.run(12)
    shard = tmp_path / "node0-local" / "step_000000012" / "shard_0"
    data = next(p for p in shard.iterdir() if p.name.endswith(".distcp"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) - 100] ^= 0xFF  # near the end: rank 0 has already loaded most of the state
    data.write_bytes(bytes(raw))
    second = c.run(13)
    # Rank 0 finds its own copy corrupt while loading it; shard 0's other copy (node 1's
    # replica) is sent to it and loaded over whatever the bad copy wrote: same step, exact.
    assert [second[r]["restored"] for r in (0, 1)] == [12, 12]
    assert second[0]["tier"] == "replica" and second[1]["tier"] == "local"
    assert second[0]["identical"] and second[1]["identical"]
    assert "corrupt" in c.logs("job2")


def test_node_killed_mid_replication_commits_nothing(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.run(8, "--kill-in-replication", "8", "--kill-node", "1", expect_ok=False)
    assert (c.out / "killed-1").exists()
    for node in (0, 1):
        assert 8 not in c.committed(node), c.committed(node)
        assert c.committed(node)[7] == [0, 1]
    assert 8 not in c.persistent_steps()
    second = c.run(9)
    assert [second[r]["restored"] for r in (0, 1)] == [7, 7]
    assert second[0]["identical"] and second[1]["identical"]


def test_a_slow_peer_fails_one_replicated_step_and_the_next_ones_commit(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    # Node 1 stalls past the 3 s replication deadline at step 6, then carries on.
    first = c.run(10, "--stall-in-replication", "6", "--repl-timeout", "3")
    assert (c.out / "stalled-1").exists()
    log = c.logs("job1")
    for r in (0, 1):
        mine = [line for line in log.splitlines() if line.startswith(f"[rank {r} ")]
        assert any("local save of step 6 failed" in line for line in mine), log[-4000:]
        assert any("replication group rebuilt" in line for line in mine), log[-4000:]
    for step in (7, 8, 9, 10):  # every later step replicated again, on both ranks
        assert log.count(f"step {step} saved locally (+") == 2, log[-4000:]
        assert f"step {step} saved locally (+0 " not in log
    for node in (0, 1):
        assert c.committed(node) == {9: [0, 1], 10: [0, 1]}
    assert all(first[r]["steps"][-1] == 10 for r in (0, 1))


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpoint_tiers.py"


def _run_example(tmp: Path, steps: int) -> str:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "2",
            "GROUP_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        argv = [
            sys.executable, str(EXAMPLE),
            "--local-ckpt-dir", str(tmp / f"local{rank}"),
            "--local-ckpt-interval", "2",
            "--persistent-ckpt-dir", f"file://{tmp / 'persistent'}",
            "--persistent-ckpt-interval", "5",
            "--steps", str(steps),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(outputs)
    return outputs[0]


def test_example_with_google_flags_resumes_from_the_local_tier(tmp_path: Path) -> None:
    first = _run_example(tmp_path, 8)
    assert "starting from scratch" in first and "done at step 8" in first
    assert sorted(p.name for p in (tmp_path / "persistent").glob("step_*")) == ["step_000000005"]
    second = _run_example(tmp_path, 10)
    assert "resumed from step 8" in second, second  # local step 8 is newer than persistent 5
