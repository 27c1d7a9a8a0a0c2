"""Restart and lost-progress time by failure class, from the launcher's diagnosis events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resiliency.goodput import compute, read_ledger
from resiliency.goodput.cli import main as cli_main
from resiliency.goodput.schema import validate_event

from ._ledgers import MIN, line, worked_example, write
from .test_calculator import _hang_job


def _diagnosis(minute: float, cls: str, ranks: list[int], **extra) -> dict:
    return line(
        "diagnosis",
        minute,
        cls=cls,
        culprit_ranks=ranks,
        culprit_nodes=["0"],
        decision="restart",
        evidence={"cause": "ValueError: bad batch at step 70", "ranks": []},
        rule="default",
        cycle=0,
        **extra,
    )


def _rows(tmp_path: Path, lines: list[dict], reference: float) -> dict:
    report = compute(read_ledger([write(tmp_path / "n0.jsonl", lines)]), reference)
    return {
        r.cls: (r.failures, r.restart_s / MIN, r.lost_progress_s / MIN) for r in report.by_class
    }


def test_the_worked_examples_crash_costs_its_restart_and_lost_steps(tmp_path: Path) -> None:
    lines = worked_example()
    at = next(i for i, x in enumerate(lines) if x["event"] == "cycle_ended")
    lines.insert(at + 1, _diagnosis(100.01, "crash", [1]))
    # The worked example: 15 min from the crash to the restarted cycle, 40 min of steps redone.
    assert _rows(tmp_path, lines, 120.0) == {"crash": (1, 15.0, 40.0)}


def test_a_hang_costs_its_detection_too(tmp_path: Path) -> None:
    lines = _hang_job()
    at = next(i for i, x in enumerate(lines) if x["event"] == "cycle_ended")
    lines.insert(at + 1, _diagnosis(41.01, "hang_io", [1]))
    # Detection from 30 to 40, then 3 min to progress again; steps 21..30 were redone.
    assert _rows(tmp_path, lines, 60.0) == {"hang_io": (1, pytest.approx(13.0), 10.0)}


def test_an_older_ledger_without_diagnoses_is_unclassified_with_the_same_totals(tmp_path):
    assert _rows(tmp_path, worked_example(), 120.0) == {"unclassified": (1, 15.0, 40.0)}


def test_the_report_prints_and_exports_the_classes(tmp_path: Path, capsys) -> None:
    lines = worked_example()
    at = next(i for i, x in enumerate(lines) if x["event"] == "cycle_ended")
    lines.insert(at + 1, _diagnosis(100.01, "crash", [1]))
    path = write(tmp_path / "n0.jsonl", lines)
    assert cli_main(["report", str(path), "--reference-step-time", "120"]) == 0
    text = capsys.readouterr().out
    assert "Failures by class" in text
    row = next(x for x in text.splitlines() if x.startswith("crash "))
    assert row.split() == ["crash", "1", "900.0s", "2400.0s"]
    assert cli_main(["report", str(path), "--reference-step-time", "120", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["by_class"] == [
        {"class": "crash", "failures": 1, "restart_s": 900.0, "lost_progress_s": 2400.0}
    ]


def test_the_diagnosis_event_is_validated() -> None:
    good = _diagnosis(1, "crash", [1])
    assert validate_event(good) is None
    assert "culprit_nodes" in (validate_event({**good, "culprit_nodes": [0]}) or "")
    assert "cls" in (validate_event({k: v for k, v in good.items() if k != "cls"}) or "")
