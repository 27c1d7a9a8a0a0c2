"""The diagnosis stops a job whose failure repeats, instead of burning every restart (issue 28).

Real ft-launcher, real ranks: rank 1 raises the same ValueError at the same step in every
attempt; with ``--max-restarts 10`` the launcher stops after 3 attempts (max_no_progress_cycles,
default 3), exits 6 and names the repeated error, and the goodput ledger holds one ``diagnosis``
event per failed attempt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, markers

from resiliency.goodput import read_ledger

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "workers" / "bad_batch_worker.py"
# The worker imports torch (for @record). The two tests of 4 attempts fork their workers from a
# server that imported it once, as a user's job does with --ft-preimport: 8 imports of torch
# became 1. The 3-attempt test keeps the plain start.
FORKED = ["--ft-preimport", "torch"]
ERROR = "ValueError: bad batch at step 3: label 7 is out of range [0, 5)"


def _args(marker_dir: Path, *extra: str) -> list[str]:
    return [
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "10",
        *FAST_FT_FLAGS,
        *extra,
        str(WORKER),
        str(marker_dir),
    ]


def test_same_error_at_the_same_step_stops_after_3_attempts(launch, marker_dir, tmp_path):
    status = tmp_path / "status.json"
    ledger = tmp_path / "ledger"
    launcher = launch(
        _args(marker_dir, "--exit-status-file", str(status), "--goodput-dir", str(ledger))
    )
    code = launcher.wait(240)
    log = launcher.log()
    assert code == 6, log
    # Three attempts of rank 1, not eleven.
    assert sorted(m.rsplit("-", 1)[0] for m in markers(marker_dir, "start-1")) == [
        "start-1-0",
        "start-1-1",
        "start-1-2",
    ], log
    (last,) = [x for x in log.splitlines() if "ft-launcher exits" in x]
    assert "exits 6 (stopped_repeated)" in last, last
    assert ERROR in last and "3 consecutive attempts" in last, last
    assert log.count("diagnosis: crash (ranks 1, nodes 0): " + ERROR) == 3, log
    verdict = json.loads(status.read_text())
    assert verdict["exit_code"] == 6 and verdict["reason"] == "stopped_repeated"
    assert [d["decision"] for d in verdict["diagnoses"]] == ["restart", "restart", "stop"]
    assert verdict["diagnoses"][-1] == {
        "cls": "crash",
        "culprit_ranks": [1],
        "culprit_nodes": [0],
        "cause": ERROR,
        "decision": "stop",
        "rule": "repeated",
    }

    events = [e for e in read_ledger([ledger]).events if e.event == "diagnosis"]
    assert [e.data["decision"] for e in events] == ["restart", "restart", "stop"]
    for event in events:
        assert event.data["cls"] == "crash"
        assert event.data["culprit_ranks"] == [1]
        assert event.data["culprit_nodes"] == ["0"]
        assert event.data["evidence"]["cause"] == ERROR
        (rank,) = event.data["evidence"]["ranks"]
        assert rank["exc_type"] == "ValueError" and rank["exitcode"] == 1
    assert events[-1].data["rule"] == "repeated"


def test_the_same_error_with_steps_gained_in_between_is_restarted(launch, marker_dir, tmp_path):
    # Each attempt records a later step in the ledger before the same error: a recurring fault
    # of a progressing job. --max-restarts ends it, not the repeated-failure rule.
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            *FAST_FT_FLAGS,
            *FORKED,
            "--goodput-dir",
            str(tmp_path / "ledger"),
            str(WORKER),
            str(marker_dir),
            "progress",
        ]
    )
    code = launcher.wait(240)
    log = launcher.log()
    assert code == 1, log
    assert len(markers(marker_dir, "progress")) == 4, log
    (last,) = [x for x in log.splitlines() if "ft-launcher exits" in x]
    assert "exits 1 (restarts_exhausted)" in last, last
    assert "stopped_repeated" not in log


def test_max_no_progress_cycles_0_keeps_max_restarts_the_only_bound(launch, marker_dir):
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            *FAST_FT_FLAGS,
            *FORKED,
            "--ft-max-no-progress-cycles",
            "0",
            str(WORKER),
            str(marker_dir),
        ]
    )
    code = launcher.wait(240)
    log = launcher.log()
    assert code == 1, log
    assert len(markers(marker_dir, "start-1")) == 4, log
    (last,) = [x for x in log.splitlines() if "ft-launcher exits" in x]
    assert "exits 1 (restarts_exhausted)" in last
    assert "decision: stop (no restarts left (--max-restarts))" in log


def test_an_import_error_in_the_first_attempt_stops_at_once(launch, marker_dir, tmp_path):
    status = tmp_path / "status.json"
    launcher = launch(
        [*_args(marker_dir, "--exit-status-file", str(status)), "import"],
    )
    code = launcher.wait(120)
    log = launcher.log()
    assert code == 2, log
    assert markers(marker_dir, "start-1") and len(markers(marker_dir, "start-1")) == 1, log
    (last,) = [x for x in log.splitlines() if "ft-launcher exits" in x]
    assert "exits 2 (config_error)" in last, last
    assert "ModuleNotFoundError: No module named 'resiliency_no_such_module'" in last, last
    assert "configuration or import error in the first attempt" in last
    verdict = json.loads(status.read_text())
    assert verdict["diagnoses"][0]["cls"] == "config"
