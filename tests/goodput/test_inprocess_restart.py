"""The ``inprocess_restart`` event: validated, and counted as restart time and lost progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resiliency.goodput import compute, read_ledger
from resiliency.goodput.cli import main as cli_main
from resiliency.goodput.schema import validate_event

from ._ledgers import MIN, line, write


def _restart(minute: float, duration_min: float, cause: str = "exception", **extra) -> dict:
    return line(
        "inprocess_restart",
        minute,
        rank=0,
        cause=cause,
        reason="RuntimeError: injected fault on rank 2 at step 10",
        ranks=[2],
        iteration=1,
        duration_s=duration_min * MIN,
        phases={"abort": 1.0, "health_check": 0.5, "barrier": 80.0, "release": 8.5},
        **extra,
    )


def _job(resume_from: int, *, launcher: bool = True, cause: str = "exception") -> list[dict]:
    """Steps of 1 min: steps 1..10 by minute 10, a fault at 10.5, the function called again at
    12 (a 90 s in-process restart), resumed after step ``resume_from``, trained to minute 18."""
    out = [line("job_started", 0), line("cycle_started", 0, cycle=0)] if launcher else []
    out += [line("step", s, step=s, rank=0) for s in range(1, 11)]
    out.append(_restart(12, 1.5, cause))
    out += [line("step", 12 + i, step=resume_from + i, rank=0) for i in range(1, 7)]
    if launcher:
        out += [
            line("cycle_ended", 18, cycle=0, cause="success"),
            line("job_ended", 18.01, exit_code=0, reason="success"),
        ]
    return out


def _report(tmp_path: Path, lines: list[dict]):
    return compute(read_ledger([write(tmp_path / "n0.jsonl", lines)]), MIN)


@pytest.mark.parametrize("launcher", [True, False], ids=["ft-launcher", "torchrun"])
def test_a_restart_that_loses_no_step_costs_its_duration(tmp_path: Path, launcher: bool) -> None:
    report = _report(tmp_path, _job(resume_from=10, launcher=launcher))
    assert report.restarts == 1
    assert [a.cause for a in report.attempts] == ["crash", None if not launcher else "success"]
    assert report.attempts[1].restore_step == 10
    seconds = report.whole.seconds
    assert seconds["restart"] == pytest.approx(1.5 * MIN)
    # only the half step in flight at the fault is lost: no step is redone
    assert seconds["lost_progress"] == pytest.approx(0.5 * MIN)
    [row] = report.by_class
    assert (row.cls, row.failures) == ("inprocess_exception", 1)
    assert row.restart_s == pytest.approx(1.5 * MIN)


def test_steps_redone_after_a_restart_are_lost_progress(tmp_path: Path) -> None:
    report = _report(tmp_path, _job(resume_from=8))
    assert report.attempts[1].restore_step == 8
    # steps 9 and 10 are done twice (2 min) plus the half step in flight at the fault
    assert report.whole.seconds["lost_progress"] == pytest.approx(2.5 * MIN)
    assert report.whole.seconds["restart"] == pytest.approx(1.5 * MIN)
    assert report.final_step == 14


def test_a_hang_is_its_own_class(tmp_path: Path) -> None:
    report = _report(tmp_path, _job(resume_from=10, cause="hang"))
    assert report.attempts[0].cause == "hang"
    assert [r.cls for r in report.by_class] == ["inprocess_hang"]


def test_a_hangs_soft_timeout_counts_as_its_detection(tmp_path: Path) -> None:
    lines = _job(resume_from=10, cause="hang")
    event = next(x for x in lines if x["event"] == "inprocess_restart")
    event["timeout_s"] = 0.4 * MIN  # the hang began at 10.1, was reported at 10.5
    assert validate_event(event) is None
    report = _report(tmp_path, lines)
    # detection (10.1 to 10.5) and the restart (to 12) are restart time; 10 to 10.1 was lost
    assert report.whole.seconds["restart"] == pytest.approx(1.9 * MIN)
    assert report.whole.seconds["lost_progress"] == pytest.approx(0.1 * MIN)
    [row] = report.by_class
    assert row.restart_s == pytest.approx(1.9 * MIN)


def test_a_diagnosis_of_the_cycle_takes_precedence(tmp_path: Path) -> None:
    lines = _job(resume_from=10)
    at = next(i for i, x in enumerate(lines) if x["event"] == "inprocess_restart")
    diagnosis = line(
        "diagnosis",
        11,
        cls="crash",
        culprit_ranks=[2],
        culprit_nodes=["0"],
        decision="restart",
        evidence={},
    )
    lines.insert(at, diagnosis)
    assert [r.cls for r in _report(tmp_path, lines).by_class] == ["crash"]


def test_the_report_prints_and_exports_it(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "n0.jsonl", _job(resume_from=10))
    assert cli_main(["report", str(path), "--reference-step-time", "60", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["restarts"] == 1
    assert data["by_class"] == [
        {
            "class": "inprocess_exception",
            "failures": 1,
            "restart_s": 90.0,
            "lost_progress_s": pytest.approx(30.0),
        }
    ]
    assert cli_main(["report", str(path), "--reference-step-time", "60"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("inprocess_"))
    assert row.split() == ["inprocess_exception", "1", "90.0s", "30.0s"]


def test_the_event_is_validated() -> None:
    good = _restart(12, 1.5)
    assert validate_event(good) is None
    assert validate_event({k: v for k, v in good.items() if k != "phases"}) is None
    for name, bad in [("ranks", ["2"]), ("duration_s", "90"), ("iteration", 1.5), ("cause", 3)]:
        assert name in (validate_event({**good, name: bad}) or ""), name
    for name in ("cause", "reason", "ranks", "iteration", "duration_s"):
        assert name in (validate_event({k: v for k, v in good.items() if k != name}) or "")


def test_a_reader_skips_it_in_an_older_ledger_unchanged(tmp_path: Path) -> None:
    """A ledger without the event reads as before: one cycle, no restart."""
    lines = [x for x in _job(resume_from=10) if x["event"] != "inprocess_restart"]
    report = _report(tmp_path, lines)
    assert report.restarts == 0
    assert report.by_class == []
