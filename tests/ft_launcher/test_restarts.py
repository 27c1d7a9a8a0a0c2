"""Real ft-launcher runs: hung and failed workers are restarted in place; restarts run out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, WORKER, markers

pytestmark = pytest.mark.slow


def _args(mode: str, marker_dir: Path, *extra: str, restarts: int = 2) -> list[str]:
    return [
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
        *FAST_FT_FLAGS,
        *extra,
        str(WORKER),
        "--mode",
        mode,
        "--marker-dir",
        str(marker_dir),
    ]


def test_hang_before_first_heartbeat_is_restarted(launch, marker_dir: Path, tmp_path: Path):
    status = tmp_path / "status.json"
    launcher = launch(
        _args(
            "hang_before_hb",
            marker_dir,
            # The worker hangs before init_workload_monitoring(): the startup timer's job (issue
            # 10; formerly the initial-heartbeat timer, which now starts at the connection).
            "--ft-rank-startup-timeout",
            "3",
            "--exit-status-file",
            str(status),
        )
    )
    assert launcher.wait(40) == 0, launcher.log()
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
    log = launcher.log()
    assert "rank 1 (local rank 1" in log and "hung: startup" in log
    verdict = json.loads(status.read_text())
    assert verdict["exit_code"] == 0 and verdict["restarts"] == 1
    assert verdict["hangs_detected"] == 1


def test_hang_in_section_is_restarted(launch, marker_dir: Path):
    launcher = launch(
        _args(
            "hang_in_section",
            marker_dir,
            "--ft-rank-heartbeat-timeout",
            "null",
            "--ft-rank-section-timeouts",
            "step:1.5",
        )
    )
    assert launcher.wait(40) == 0, launcher.log()
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
    log = launcher.log()
    assert "hung: section:step" in log
    assert "hang verdict:" in log


@pytest.mark.parametrize("mode,expected", [("crash", "exited with code 7"), ("exception", "")])
def test_failed_worker_is_restarted(launch, marker_dir: Path, mode: str, expected: str):
    launcher = launch(_args(mode, marker_dir))
    assert launcher.wait(40) == 0, launcher.log()
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
    log = launcher.log()
    assert "restarting the worker group (rank 1 (local rank 1" in log
    assert expected in log
    if mode == "exception":
        assert "RuntimeError: injected failure on rank 1" in log


def test_restarts_exhausted_exits_1_with_root_cause(launch, marker_dir: Path, tmp_path: Path):
    status = tmp_path / "status.json"
    launcher = launch(
        [
            *_args("crash", marker_dir, "--exit-status-file", str(status), restarts=1),
            "--fault-attempt",
            "-1",  # fails on every attempt
        ]
    )
    assert launcher.wait(40) == 1, launcher.log()
    assert "done-1-0" not in markers(marker_dir, "done")
    log = launcher.log()
    (last,) = [x for x in log.splitlines() if "ft-launcher exits" in x]
    assert "exits 1 (restarts_exhausted)" in last
    assert "root cause: rank 1 (local rank 1" in last and "exited with code 7" in last
    # torch's failure table comes before it, as a log record; the final line is the last one
    # (issue 30, item 11b: no ChildFailedError traceback after it).
    assert log.rstrip().splitlines()[-1] == last
    assert "Traceback" not in log and "ChildFailedError" not in log
    assert log.index("Root Cause (first observed failure)") < log.index(last)
    assert "exitcode  : 7" in log
    verdict = json.loads(status.read_text())
    assert verdict["exit_code"] == 1 and verdict["reason"] == "restarts_exhausted"
    assert len(verdict["failures"]) == 2


def test_a_worker_exception_gives_torchruns_failure_report_and_error_file(launch, tmp_path: Path):
    error_file = tmp_path / "launcher-error.json"
    worker = Path(__file__).parent / "workers" / "record_worker.py"
    launcher = launch(
        ["--nproc-per-node", "2", "--max-restarts", "0", *FAST_FT_FLAGS, str(worker)],
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    assert launcher.wait(60) == 1, launcher.log()
    log = launcher.log()
    assert "ft-launcher exits 1 (restarts_exhausted)" in log.rstrip().splitlines()[-1]
    assert "ChildFailedError" not in log
    assert "Root Cause (first observed failure)" in log
    assert "rank      : 1 (local_rank: 1)" in log
    assert "injected failure in rank 1" in log  # the worker's traceback, from its error file
    copied = json.loads(error_file.read_text())  # the worker's error, copied by @record
    assert "injected failure in rank 1" in json.dumps(copied)


def _events(log: str) -> list[dict]:
    """torch's elastic events, as its "console" event handler writes them (one JSON a line)."""
    events = []
    for line in log.splitlines():
        start = line.find('{"name": "torchelastic.')
        if start >= 0:
            events.append(json.loads(line[start:]))
    return events


def test_torchs_launcher_path_records_its_agent_and_worker_events(launch, marker_dir: Path):
    # torch's launch_agent records the agent's own event (source AGENT) once agent.run() returns;
    # a launcher re-implementing launch_agent records only the workers'.
    launcher = launch(
        ["--event-log-handler", "console", *_args("ok", marker_dir, restarts=0)],
    )
    assert launcher.wait(60) == 0, launcher.log()
    events = _events(launcher.log())
    agent = [e["name"] for e in events if e["source"] == "AGENT"]
    workers = [e for e in events if e["source"] == "WORKER"]
    assert "torchelastic.worker.status.RENDEZVOUS" in agent, agent
    assert agent[-1] == "torchelastic.worker.status.SUCCEEDED", agent
    finals = {e["metadata"]["global_rank"]: e["name"] for e in workers}  # the last per rank
    assert finals == {r: "torchelastic.worker.status.SUCCEEDED" for r in (0, 1)}, events


def test_a_failed_run_records_the_agents_event_and_the_failed_worker(launch, marker_dir: Path):
    launcher = launch(
        ["--event-log-handler", "console", *_args("crash", marker_dir, restarts=0)],
    )
    assert launcher.wait(60) == 1, launcher.log()
    events = _events(launcher.log())
    # agent.run() itself succeeded (it reported the failure): torch records SUCCEEDED for the
    # agent, FAILED for the worker that crashed, then raises ChildFailedError (which the
    # launcher reports before its final line).
    agent = [e["name"] for e in events if e["source"] == "AGENT"]
    assert agent[-1] == "torchelastic.worker.status.SUCCEEDED", agent
    failed = [e for e in events if e["source"] == "WORKER" and e["name"].endswith("FAILED")]
    # The crashed rank (rank 0, stopped by the agent, may be reported too).
    assert 1 in {e["metadata"]["global_rank"] for e in failed}, events
    assert "torch's failure report:" in launcher.log()


def test_after_a_crash_the_other_ranks_are_stopped_as_the_launchers_own_stop(
    launch, marker_dir: Path
) -> None:
    # torch's process context would SIGTERM the survivor itself, unmarked, and wait 30 s: the
    # survivor would take it for a preemption and hold the restart up with its save. A restart
    # that waited for the survivor would last the whole 300 s stop timeout, far past wait(90).
    args = _args("crash_reads_stop_mark", marker_dir, "--workers-stop-timeout", "300", restarts=1)
    launcher = launch([*args, "--steps", "40"])
    assert launcher.wait(90) == 0, launcher.log()
    assert markers(marker_dir, "launcherstop") == ["launcherstop-0-0"], launcher.log()
    assert markers(marker_dir, "preemption") == []
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
