"""Calculated timeouts across three simulated successive jobs, each with its own monitor.

Job 1 observes, calculates and saves its state as JSON; job 2 loads it and its monitor kills a
hang on the calculated (much tighter) timeout; job 3 loads job 1's state, observes different
intervals and merges (timeouts only grow). Run with and without sections.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

SAFETY_FACTOR = 10.0
CONFIGURED = 30.0  # every configured timeout; a calculated one is far below

JOB_CONFIG = {
    "initial_rank_heartbeat_timeout": CONFIGURED,
    "rank_heartbeat_timeout": CONFIGURED,
    "rank_section_timeouts": {"step": CONFIGURED},
    "safety_factor": SAFETY_FACTOR,
    # These jobs test the calculation itself on sub-second intervals; the floor has its own test.
    "calculated_timeout_floor": 0.0,
}

JOB1 = """
import json
client.send_heartbeat()
for _ in range(8):
    if USE_SECTIONS:
        client.start_section("step")
        time.sleep(0.05)
        client.end_section("step")
    else:
        time.sleep(0.05)
    client.send_heartbeat()
    time.sleep(0.02)
assert client.calculate_and_set_hb_timeouts()
assert client.calculate_and_set_section_timeouts() == USE_SECTIONS
json.dump(client.state_dict(), open(STATE, "w"))
client.shutdown_workload_monitoring()
"""

JOB2 = """
import json
client.send_heartbeat()  # progress first: the initial timeout is not what this job tests
client.load_state_dict(json.load(open(STATE)))

def hang_with_calculated_timeouts():
    if USE_SECTIONS:
        client.start_section("step")
        while True:  # heartbeats stay fresh; only the section is stuck
            client.send_heartbeat()
            time.sleep(0.05)
    time.sleep(120)

hang_with_calculated_timeouts()
"""

JOB3 = """
import json
client.send_heartbeat()
client.load_state_dict(json.load(open(STATE)))
for _ in range(5):
    if USE_SECTIONS:
        client.start_section("step")
        client.end_section("step")  # shorter than in job 1
        client.start_section("wait")
        time.sleep(0.15)
        client.end_section("wait")
    else:
        time.sleep(0.15)  # longer gaps than in job 1
    client.send_heartbeat()
assert client.calculate_and_set_hb_timeouts()
assert client.calculate_and_set_section_timeouts() == USE_SECTIONS
json.dump(client.state_dict(), open(STATE + ".job3", "w"))
client.shutdown_workload_monitoring()
"""


def _script(body: str, state, use_sections: bool) -> str:
    return f"USE_SECTIONS = {use_sections}\nSTATE = {str(state)!r}\n{body}"


@pytest.mark.parametrize("use_sections", [True, False], ids=["sections", "heartbeats-only"])
def test_three_successive_jobs(start_monitor, spawn_rank, tmp_path, use_sections):
    state_path = tmp_path / "_ft_state.json"

    # Job 1: observe and calculate.
    monitor1 = start_monitor(**JOB_CONFIG)
    job1 = spawn_rank(_script(JOB1, state_path, use_sections), monitor1)
    assert job1.wait(30) == 0, job1.output() + monitor1.log()
    state1 = json.loads(state_path.read_text())["current_timeouts"]
    hb1, sec1 = state1["heartbeat"], state1["section"]
    assert hb1["were_calculated"] is True
    # Observed gaps are >= 0.05 s; far below the configured 30 s even on a loaded machine.
    assert 0.05 * SAFETY_FACTOR <= hb1["subsequent"] < 10.0
    if use_sections:
        assert 0.05 * SAFETY_FACTOR <= sec1["section"]["step"] < 10.0
        assert sec1["calculated_sections"] == ["step"]
    else:
        assert sec1["section"] == {"step": CONFIGURED}
        assert sec1["calculated_sections"] == []
    assert "set timeouts" in monitor1.log()
    monitor1.proc.stop()

    # Job 2: a new monitor uses the loaded timeouts and kills on the tighter one.
    monitor2 = start_monitor(**JOB_CONFIG)
    job2 = spawn_rank(_script(JOB2, state_path, use_sections), monitor2)
    hang = monitor2.wait_event("hang", pid=job2.pid, timeout=60)
    if use_sections:
        assert hang.timer == "section:step"
        assert hang.limit == sec1["section"]["step"]
    else:
        assert hang.timer == "heartbeat"
        assert hang.limit == hb1["subsequent"]
    # Expected just over the calculated limit (under 1 s); the configured 30 s, 30x that, is
    # what a monitor ignoring the loaded state would have waited.
    assert hang.elapsed < CONFIGURED
    assert hang.stack_dump and "hang_with_calculated_timeouts" in hang.stack_dump
    assert monitor2.wait_event("killed", pid=job2.pid).signal == "SIGTERM"
    monitor2.proc.stop()

    # Job 3: load job 1's state, observe different intervals, merge by maximum.
    monitor3 = start_monitor(**JOB_CONFIG)
    job3 = spawn_rank(_script(JOB3, state_path, use_sections), monitor3)
    assert job3.wait(30) == 0, job3.output() + monitor3.log()
    assert not any(e.kind == "hang" for e in monitor3.drain(0.1))
    state3 = json.loads((tmp_path / "_ft_state.json.job3").read_text())["current_timeouts"]
    hb3, sec3 = state3["heartbeat"], state3["section"]
    assert hb3["subsequent"] >= max(hb1["subsequent"], 0.15 * SAFETY_FACTOR)
    assert hb3["initial"] >= hb1["initial"]
    if use_sections:
        # 'step' was much shorter in job 3: job 1's larger calculated value is kept.
        assert sec3["section"]["step"] == sec1["section"]["step"]
        assert sec3["section"]["wait"] >= 0.15 * SAFETY_FACTOR
        assert sec3["calculated_sections"] == ["step", "wait"]
    else:
        assert sec3 == sec1


# Issue 30, item 7: what a 100-step Lightning job saved (no floor then).
TINY_STATE = {
    "current_timeouts": {
        "heartbeat": {"initial": 0.916, "subsequent": 0.252, "were_calculated": True},
        "section": {
            "section": {"step": 0.05},
            "out_of_section": None,
            "calculated_sections": ["step"],
            "is_out_of_section_calculated": False,
        },
    }
}

LOAD_TINY = """
import json
client.load_state_dict(json.load(open(STATE)))
print("in effect:", client.hb_timeouts.initial, client.hb_timeouts.subsequent,
      client.section_timeouts.section["step"], flush=True)
client.shutdown_workload_monitoring()
"""


def test_loaded_tiny_timeouts_are_floored_and_said_to_replace_an_explicit_setting(
    start_monitor, spawn_rank, tmp_path
):
    state_path = tmp_path / "_ft_state.json"
    state_path.write_text(json.dumps(TINY_STATE))
    # Explicit, as --ft-rank-heartbeat-timeout 5 on the command line; the floor is the default.
    monitor = start_monitor(rank_heartbeat_timeout=5.0, rank_section_timeouts={"step": 20.0})
    job = spawn_rank(_script(LOAD_TINY, state_path, False), monitor)
    assert job.wait(30) == 0, job.output() + monitor.log()
    out = job.output()
    assert "in effect: 60.0 60.0 60.0" in out, out
    warnings = [line for line in out.splitlines() if "calculated by an earlier job" in line]
    assert len(warnings) == 1, out
    assert (
        "rank_heartbeat_timeout: 60 s (saved 0.252 s, raised to the floor 60 s) replaces the "
        "configured 5 s" in warnings[0]
    )
    assert "rank_section_timeouts[step]: 60 s (saved 0.05 s, raised to the floor 60 s) " in out
    assert "initial_rank_heartbeat_timeout: 60 s (saved 0.916 s, raised to the floor 60 s)" in out
    assert "set timeouts: initial 60 s, heartbeat 60 s, sections {step 60 s}" in monitor.log()


def test_a_job_never_calculates_below_the_floor(start_monitor, spawn_rank, tmp_path):
    state_path = tmp_path / "_ft_state.json"
    monitor = start_monitor(**{**JOB_CONFIG, "calculated_timeout_floor": 2.5})
    job = spawn_rank(_script(JOB1, state_path, True), monitor)
    assert job.wait(30) == 0, job.output() + monitor.log()
    state = json.loads(state_path.read_text())["current_timeouts"]
    # Observed: about 0.07 s x 10; the floor wins.
    assert state["heartbeat"]["subsequent"] == 2.5
    assert state["section"]["section"]["step"] == 2.5
    assert "set timeouts: initial 2.5 s, heartbeat 2.5 s, sections {step 2.5 s}" in monitor.log()
