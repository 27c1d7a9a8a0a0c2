"""An in-process restart is one ``inprocess_restart`` event in the job's goodput ledger, and
``resiliency-goodput report`` counts it as a restart.

4 gloo ranks under plain torchrun with ``RESILIENCY_GOODPUT_DIR`` set, as the launcher sets it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inprocess_harness import FAULT_STEP, NPROC, Torchrun

from resiliency.goodput import DIR_ENV, compute, read_ledger, validate_event
from resiliency.goodput.cli import main as report_main


@pytest.mark.slow
def test_a_rank_raising_is_one_restart_in_the_ledger_and_the_report(
    torchrun: Torchrun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger_dir = tmp_path / "ledger"
    run = torchrun.run(
        "--raise",
        f"2@{FAULT_STEP}",
        name="ledger",
        env={DIR_ENV: str(ledger_dir), "RESILIENCY_JOB_ID": "inprocess-ledger"},
    )
    assert run.returncode == 0, run.output[-8000:]
    assert sorted(s["rank"] for s in run.starts(1)) == list(range(NPROC))
    paths = sorted(ledger_dir.glob("*.jsonl"))
    assert paths, f"no ledger written in {ledger_dir}"
    lines = [json.loads(x) for p in paths for x in p.read_text().splitlines() if x]
    restarts = [x for x in lines if x["event"] == "inprocess_restart"]
    assert len(restarts) == 1, restarts
    [event] = restarts
    assert validate_event(event) is None
    assert event["cause"] == "exception"
    assert event["reason"].startswith(
        f"rank 2: RuntimeError: injected fault on rank 2 at step {FAULT_STEP}"
    ), event["reason"]
    assert event["ranks"] == [2]
    assert event["lost_ranks"] == []
    assert event["iteration"] == 1
    assert event["rank"] == 0
    assert set(event["phases"]) == {"abort", "health_check", "barrier", "release"}
    assert event["duration_s"] >= sum(event["phases"].values()) * 0.99 > 0

    report = compute(read_ledger(paths))
    assert report.restarts == 1
    assert report.attempts[0].cause == "crash"
    # the model and the step live in memory: training went on from the fault's step
    assert report.attempts[1].restore_step is not None
    assert report.attempts[1].restore_step >= FAULT_STEP
    assert report.timeline is not None and sum(report.timeline.work.lost) == 0
    assert report.whole.seconds["restart"] >= event["duration_s"] * 0.999
    [row] = report.by_class
    assert (row.cls, row.failures) == ("inprocess_exception", 1)
    assert row.restart_s >= event["duration_s"] * 0.999

    assert report_main(["report", str(ledger_dir)]) == 0
    out = capsys.readouterr().out
    assert any(x.split()[:2] == ["inprocess_exception", "1"] for x in out.splitlines()), out


@pytest.mark.slow
def test_a_hang_is_recorded_as_a_hang(torchrun: Torchrun, tmp_path: Path) -> None:
    ledger_dir = tmp_path / "ledger"
    run = torchrun.run(
        "--hang",
        f"1@{FAULT_STEP}",
        "--soft",
        "4",
        "--hard",
        "40",
        name="hang",
        env={DIR_ENV: str(ledger_dir)},
    )
    assert run.returncode == 0, run.output[-8000:]
    lines = [json.loads(x) for p in ledger_dir.glob("*.jsonl") for x in p.read_text().splitlines()]
    [event] = [x for x in lines if x["event"] == "inprocess_restart"]
    assert event["cause"] == "hang"
    # every rank stalls in a hang: the ranks whose soft timeout fired first are named, each
    # with where its main thread sat (the culprit is the one outside the collective)
    assert event["ranks"] and set(event["ranks"]) <= set(range(NPROC))
    assert "no progress for" in event["reason"] and "main thread at" in event["reason"]
    assert event["duration_s"] > 0
    assert event["timeout_s"] == 4.0  # the hang began a soft timeout before it was reported
    [row] = compute(read_ledger(sorted(ledger_dir.glob("*.jsonl")))).by_class
    assert (row.cls, row.failures) == ("inprocess_hang", 1)


@pytest.mark.slow
def test_a_ledger_that_cannot_be_written_never_stops_the_restart(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the ledger directory should be\n")
    run = torchrun.run(
        "--raise", f"2@{FAULT_STEP}", name="unwritable", env={DIR_ENV: str(blocker / "ledger")}
    )
    assert run.returncode == 0, run.output[-8000:]
    assert sorted(s["rank"] for s in run.starts(1)) == list(range(NPROC))
    assert {s["step"] for s in run.starts(1)} == {FAULT_STEP}
    # the recorder said why it wrote nothing, and training went on
    assert "goodput recorder: cannot write" in run.output, run.output[-6000:]


@pytest.mark.slow
def test_the_restart_s_heal_records_the_step_it_resumed_from_and_the_steps_lost(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    """Issue 32 step 5: the step and the steps lost are known once the ranks agreed (in
    ``Healer.heal``, after the restart): its ``inprocess_heal`` event carries them, with the
    restart's iteration."""
    ledger_dir = tmp_path / "ledger"
    run = torchrun.run(
        "--heal",
        "--momentum",
        "0.9",
        "--raise",
        f"2@{FAULT_STEP}",
        "--forget",
        "2",
        name="heal-ledger",
        env={DIR_ENV: str(ledger_dir)},
    )
    assert run.returncode == 0, run.output[-8000:]
    lines = [json.loads(x) for p in ledger_dir.glob("*.jsonl") for x in p.read_text().splitlines()]
    [restart] = [x for x in lines if x["event"] == "inprocess_restart"]
    [heal] = [x for x in lines if x["event"] == "inprocess_heal"]
    assert validate_event(heal) is None
    assert heal["iteration"] == restart["iteration"] == 1
    assert heal["step"] == FAULT_STEP  # every rank resumed at the fault's step
    assert heal["lost_steps"] == 0
    assert heal["healed_ranks"] == [2] and 2 not in heal["source_ranks"]
    assert heal["time"] >= restart["time"]
