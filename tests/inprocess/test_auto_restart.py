"""inprocess.auto_restart (NVRx's monitor_and_restart) with real forks, signals and exits, and
under plain torchrun: a SIGKILLed rank's replacement joins the running job and is healed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from inprocess_harness import FAULT_STEP, NPROC, Torchrun
from zygote_client import start_python

JOB = Path(__file__).with_name("jobs") / "auto_restart_job.py"
DEADLINE_S = 60.0
# Both files fork from one zygote (torch and resiliency.inprocess imported): in one xdist
# worker, so it starts once.
pytestmark = pytest.mark.xdist_group("inprocess_tools_zygote")


def test_a_failed_child_is_forked_again_until_one_exits_0(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    job = start_python(
        ("torch", "resiliency.inprocess"),
        [str(JOB), str(counter)],
        dict(os.environ),
        subprocess.PIPE,
        text=True,
    )
    try:
        assert job.wait(DEADLINE_S) == 0  # the supervisor ends with the child that succeeded
    finally:
        if job.poll() is None:
            job.kill()
        out = job.communicate(DEADLINE_S)[0]
    assert counter.read_text() == "3", out
    children = [int(pid) for pid in re.findall(r"Launched child (\d+)", out)]
    assert len(children) == 3 and job.pid not in children, out
    first, second, third = children
    assert out.startswith("Starting self-monitoring mode\n"), out
    for line in (
        f"Child {first} exited with signal 9",
        f"Child {second} exited with status 1",
        f"Child {third} exited with status 0",
        f"child run 3 (pid {third})",
    ):
        assert line in out, out


@pytest.mark.slow
def test_under_torchrun_a_sigkilled_rank_is_forked_again_joins_and_is_healed(
    torchrun: Torchrun,
) -> None:
    # Rank 2's child SIGKILLs itself at step 5. Its supervisor (the process torchrun started)
    # forks a replacement 0.2 s later; the other ranks keep their processes and wait for it at
    # the restart barrier; it joins as rank 2, is healed from a peer, and no step is lost.
    run = torchrun.run(
        *("--heal", "--momentum", "0.9", "--kill", f"2@{FAULT_STEP}", "--auto-restart", "0.2")
    )
    assert run.returncode == 0, run.output[-8000:]  # torchrun saw no worker fail
    first = {s["rank"]: s for s in run.starts(0)}
    again = {s["rank"]: s for s in run.starts(1)}
    assert sorted(first) == sorted(again) == list(range(NPROC)), run.output[-6000:]
    assert not run.starts(2), "one fault is one restart"
    assert f"Child {first[2]['pid']} exited with signal 9" in run.output, run.output[-6000:]
    for rank in (0, 1, 3):
        assert again[rank]["pid"] == first[rank]["pid"], f"rank {rank} was restarted"
    assert again[2]["pid"] != first[2]["pid"]
    assert f"Launched child {again[2]['pid']}" in run.output
    assert "joining the running job" in run.output
    assert {s["step"] for s in again.values()} == {FAULT_STEP}, "a step was lost"
    assert all(s["params"] == again[0]["params"] for s in again.values())
    heals = {r["rank"]: r for r in run.records if r["event"] == "heal" and r["iteration"] == 1}
    assert heals[2]["healed"] and heals[2]["source"] in (0, 1, 3)
    assert heals[2]["previous_step"] == 0  # a new process: its own initial state, healed
    assert all(h["lost_steps"] == 0 for h in heals.values())
    finals = [r["params"] for r in run.records if r["event"] == "done"]
    assert len(finals) == NPROC and all(f == finals[0] for f in finals)


@pytest.mark.slow
def test_under_torchrun_a_replacement_the_job_no_longer_takes_is_not_forked_again(
    torchrun: Torchrun,
) -> None:
    # The others declare rank 2 gone after 3 s without its heartbeat and go on as 3 ranks; its
    # replacement comes 5 s after the kill, is refused, and its supervisor stops there (NVRx's
    # would fork a new child every 5 s for as long as torchrun waits).
    run = torchrun.run(
        *("--kill", f"2@{FAULT_STEP}", "--auto-restart", "5", "--heartbeat-timeout", "3"),
        *("--steps", "400", "--step-time", "0.05"),
    )
    assert run.returncode != 0, run.output[-6000:]  # torchrun ends the job: a worker failed
    refusal = re.search(
        r"Child (\d+) could not rejoin the job \((.*)\); not forking again", run.output
    )
    assert refusal, run.output[-8000:]
    assert "RankDiscarded: initial rank 2 was respawned" in refusal.group(2)
    assert "declared it gone" in refusal.group(2)
    replacements = [s for s in run.records if s["event"] == "start" and s["rank"] == 2]
    assert len({s["pid"] for s in replacements}) == 1, "the refused replacement never trained"
    assert run.output.count(f"Launched child {refusal.group(1)}") == 1
