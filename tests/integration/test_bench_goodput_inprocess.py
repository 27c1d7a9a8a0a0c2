"""The goodput benchmark's in-process setup, briefly: one SIGKILL, healed in-process.

`benchmarks/bench_goodput.py --setups inprocess` runs its job under two ft-launchers with
`--ft-inprocess-respawn`. One rank is SIGKILLed a few seconds after the first training step;
the ledger must show that the launcher respawned it alone and the Wrapper restarted in-process
(no cycle of the launcher ended), that the heal resumed at the step the job had reached (0 steps
lost), and the launcher log that the surviving rank kept its process.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("resiliency.launcher")
pytest.importorskip("resiliency.inprocess")

from resiliency.goodput import read_ledger
from resiliency.simulator import Fault, FaultPlan

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import bench_goodput  # noqa: E402 - the benchmark's own setups, from its folder

KILL_AFTER_FIRST_STEP_S = 4.0
# Start-up under two launchers takes 10-45 s on two loaded cores; the kill comes after the
# first step, and the rest leaves time for the heal and steps after it.
DURATION_S = 70.0
WORLD = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the inprocess setup with one SIGKILL (the runner stops every process)."""
    work = tmp_path_factory.mktemp("bench-goodput-inprocess")
    args = bench_goodput.parser().parse_args(
        [
            *("--duration", str(DURATION_S)),
            # Two ranks per node: the launcher respawns a rank alone only while another of its
            # node's workers still runs (with none left it restarts its group).
            *("--nproc-per-node", "2"),
            *("--setups", "inprocess"),
            "--from-first-step",
        ]
    )
    plan = FaultPlan(
        seed=0,
        mtbf=float("inf"),
        keep_alive=0.0,
        faults=(Fault(at_s=KILL_AFTER_FIRST_STEP_S, kind="kill", victim=1, seed=0),),
    )
    result = bench_goodput.run_setup("inprocess", plan, args, work)
    events = read_ledger([work / "inprocess" / "ledger"]).events
    log = (work / "inprocess.log").read_text()
    return {"result": result, "events": events, "log": log}


def _named(run: dict[str, Any], name: str) -> list[Any]:
    return [e for e in run["events"] if e.event == name]


def test_the_kill_was_injected_seen_and_recovered_with_no_step_lost(run: dict[str, Any]) -> None:
    (fault,) = run["result"]["faults"]
    assert fault["kind"] == "kill" and fault["injected_s"] is not None, fault
    assert fault["detected_s"] is not None, (fault, run["log"][-3000:])
    assert fault["recovered_s"] is not None, (fault, run["log"][-3000:])
    assert fault["steps_lost"] == 0, fault


def test_the_killed_rank_was_healed_in_process_from_its_peer(run: dict[str, Any]) -> None:
    restarts = _named(run, "inprocess_restart")
    heals = _named(run, "inprocess_heal")
    assert len(restarts) == 1, (restarts, run["log"][-3000:])
    assert restarts[0].data["cause"] == "peer_fault"
    assert restarts[0].data["lost_ranks"] == []
    assert len(heals) == 1, heals
    heal = heals[0].data
    assert heal["lost_steps"] == 0
    assert heal["iteration"] == restarts[0].data["iteration"] == 1
    victim = int(run["result"]["faults"][0]["victim"].split()[-1])
    assert heal["healed_ranks"] == [victim]
    assert heal["source_ranks"] == sorted(set(range(WORLD)) - {victim})
    # No full restart: each launcher's group ran in its first cycle from start to end.
    assert [e.data["cycle"] for e in _named(run, "cycle_started")] == [0, 0]


def test_only_the_killed_rank_got_a_new_process(run: dict[str, Any]) -> None:
    log = run["log"]
    victim = run["result"]["faults"][0]["victim"].split()[-1]
    respawns = re.findall(r"rank (\d+) \(local rank \d, pid \d+\) died \(SIGKILL\); respawned", log)
    assert respawns == [victim], log[-3000:]
    # Each launcher started its workers once: the survivors kept their processes.
    assert len(re.findall(r"workers started \(attempt 0\)", log)) == 2, log[-3000:]
    assert "workers started (attempt 1)" not in log
