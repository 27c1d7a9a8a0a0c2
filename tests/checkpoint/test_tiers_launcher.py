"""Tiers under two ft-launchers on loopback as two nodes (c10d rendezvous, gloo, 1 rank each).

Each launcher is a node with its own local-tier directory. Local saves every step (replicated to
the other node), persistent every 5 steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ft_launcher"))

from launcher_harness import Launcher, free_port
from tiers_harness import WORKER, Cluster

pytestmark = pytest.mark.slow


class Nodes:
    """Start one job as two launchers; the first one started hosts the rendezvous store."""

    def __init__(self, tmp: Path) -> None:
        self.c = Cluster(tmp)
        self.tmp = tmp
        self.started: list[Launcher] = []

    def job(self, steps: int, *extra: str, first: int = 0, restarts: int = 0) -> list[int]:
        self.c.jobs += 1
        tag = f"job{self.c.jobs}"
        port = free_port()
        launchers = []
        for node_dir in (first, 1 - first):
            args = [
                "--nnodes", "2",
                "--nproc-per-node", "1",
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"{tag}-{port}",
                "--rdzv-conf",
                "join_timeout=60,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=2",
                "--local-addr", "127.0.0.1",
                "--max-restarts", str(restarts),
                "--monitor-interval", "0.1",
                "--no-gpu-health-check",
                # Workers forked from a pre-imported server: a restarted worker does not import
                # torch again. The tests are about the tiers, not the spawn path.
                "--ft-preimport", "torch",
                str(WORKER), str(self.c.persistent), str(steps), "--tag", tag, *extra,
            ]  # fmt: skip
            env = self.c.env(node_dir, tag)
            launcher = Launcher(args, self.tmp / f"{tag}-launcher-dir{node_dir}.log", env=env)
            self.started.append(launcher)
            launchers.append(launcher)
            if not launchers[1:]:
                launcher.wait_for_log("worker(s) on this node", 60)
        codes = [launcher.wait(240) for launcher in launchers]
        assert codes == [0, 0], "".join(launcher.log()[-5000:] for launcher in launchers)
        return codes

    def results(self) -> dict[int, dict]:
        return self.c.results(f"job{self.c.jobs}", 2)

    def placement(self) -> dict[str, set[int]]:
        """local dir name (``node<i>-local``) -> group ranks of the workers that used it."""
        prefix = f"place-job{self.c.jobs}-"
        out: dict[str, set[int]] = {}
        for p in self.c.out.glob(prefix + "*"):
            _, group_rank, name = p.name.removeprefix(prefix).split("-", 2)
            out.setdefault(name, set()).add(int(group_rank.removeprefix("g")))
        return out


@pytest.fixture
def nodes(tmp_path: Path):
    n = Nodes(tmp_path)
    yield n
    for launcher in n.started:
        launcher.kill()
    from tiers_harness import kill_recorded  # noqa: PLC0415

    kill_recorded(n.c.out)


def test_two_launchers_replica_and_permutation(nodes: Nodes) -> None:
    c = nodes.c
    nodes.job(12)
    place = nodes.placement()
    node1_dir = next(
        int(d.removeprefix("node").split("-")[0]) for d, g in place.items() if g == {1}
    )
    c.wipe(node1_dir)
    nodes.job(14)
    r = nodes.results()
    assert [r[g]["restored"] for g in (0, 1)] == [12, 12]
    assert r[1]["tier"] == "replica" and r[0]["tier"] == "local"
    assert r[0]["identical"] and r[1]["identical"]

    # Start the launchers in the other order: the node ranks come out permuted.
    before = nodes.placement()
    nodes.job(16, first=node1_dir)
    after = nodes.placement()
    r = nodes.results()
    assert [r[g]["restored"] for g in (0, 1)] == [14, 14]
    assert r[0]["identical"] and r[1]["identical"]
    assert after != before, (before, after)  # the permutation did happen
    # The fall back to the persistent tier when every local copy is lost does not depend on
    # who placed the ranks: test_tiers.py's test_replica_restore_permuted_nodes_and_persistent_
    # fallback runs it (a fourth job here cost ~15 s of two launchers and two ranks).


def test_node_killed_mid_replication_restarts_in_job_from_previous_step(nodes: Nodes) -> None:
    # Attempt 0: node 1's rank dies while replicating step 8; the launchers restart both
    # workers in place; attempt 1 restores step 7 (8 was committed nowhere) and goes on.
    nodes.job(10, "--kill-in-replication", "8", "--kill-node", "1", restarts=1)
    assert (nodes.c.out / "killed-1").exists()
    r = nodes.results()  # written by each node's last worker
    assert [r[g]["restored"] for g in (0, 1)] == [7, 7]
    assert r[0]["identical"] and r[1]["identical"]
    # Stable placement: each node kept its group rank across the in-job restart.
    place = nodes.placement()
    assert sorted(place.values(), key=min) == [{0}, {1}], place
