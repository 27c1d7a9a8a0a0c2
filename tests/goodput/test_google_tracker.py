"""Google Cloud Resiliency's logs exactly as its tracker writes them (issue 27).

Naive local ``isoformat()`` times, float steps and node ranks, every node writing its own starts
and ends, lines in any order. Google's figure is checked against Google's calculator logic
(`_google_logs.google_calculator`) run on the same lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from resiliency.goodput import LedgerReader, compute, read_ledger
from resiliency.goodput._render import render_text

from ._google_logs import google_calculator, large_google_job, worked_example_google


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_worked_example_in_googles_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "tracker.jsonl", worked_example_google())
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "resiliency.goodput",
            "report",
            str(path),
            "--reference-step-time",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    expected = google_calculator(worked_example_google(), 120.0)["goodput"]
    assert expected == 0.5
    assert "Goodput: 50.0 %" in result.stdout
    assert "Google Cloud Resiliency's figure: 50.0 %" in result.stdout
    assert "Cycles: 2 (1 restart)" in result.stdout
    assert "Google's figure leaves out" in result.stdout
    assert "warning" not in result.stderr
    notes = [x for x in result.stderr.splitlines() if x.startswith("note: ")]
    assert len(notes) == 1 and "no time zone" in notes[0] and "UTC" in notes[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_large_shuffled_job_gives_googles_figure_and_its_cycles(tmp_path: Path, seed: int) -> None:
    restarts = 30
    lines = large_google_job(nodes=112, restarts=restarts, seed=seed, load_first=seed == 2)
    assert sum(x["event_type"] == "job_started" for x in lines) == 112 * (restarts + 1)
    assert isinstance(lines[0]["timestamp"], str) and "+" not in lines[0]["timestamp"]
    ledger = read_ledger([_write(tmp_path / "tracker.jsonl", lines)])
    assert ledger.warnings == []
    report = compute(ledger, 2.0)
    google = google_calculator(lines, 2.0)
    assert report.google_figure == google["goodput"]  # exactly: the same arithmetic
    assert 0.3 < report.google_figure < 0.9
    assert google["job_started_count"] == restarts + 1
    assert len(report.attempts) == restarts + 1 and report.restarts == restarts
    assert [a.cause for a in report.attempts] == ["crash"] * restarts + ["success"]
    assert sum(report.whole.seconds.values()) == pytest.approx(report.whole.total)
    assert report.whole.total == pytest.approx(google["span_s"])
    # Every restart loads the last save: what the failure lost is counted.
    assert report.whole.seconds["lost_progress"] > 0
    assert all(a.restore_step is not None for a in report.attempts)


def test_naive_times_are_read_in_the_given_zone(tmp_path: Path) -> None:
    lines = large_google_job(nodes=8, restarts=3, seed=5)
    path = _write(tmp_path / "tracker.jsonl", lines)
    utc = compute(read_ledger([path]), 2.0)
    zone = ZoneInfo("Asia/Kolkata")  # +05:30, no daylight saving time
    local = compute(read_ledger([path], zone=zone), 2.0)
    assert local.whole.start == pytest.approx(utc.whole.start - 5.5 * 3600)
    assert local.whole.seconds == pytest.approx(utc.whole.seconds)
    assert local.google_figure == utc.google_figure == google_calculator(lines, 2.0)["goodput"]
    assert len(local.notes) == 1 and "Asia/Kolkata" in local.notes[0]


def test_the_timezone_option(tmp_path: Path) -> None:
    path = _write(tmp_path / "tracker.jsonl", worked_example_google())
    cli = [sys.executable, "-m", "resiliency.goodput", "report", str(path)]
    out = subprocess.run(
        [*cli, "--timezone", "Asia/Kolkata", "--json", "--reference-step-time", "120"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    data = json.loads(out)
    assert data["google_goodput"] == data["goodput"] == 0.5
    assert data["restarts"] == 1 and "Asia/Kolkata" in data["notes"][0]
    bad = subprocess.run(
        [*cli, "--timezone", "Mars/Olympus"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown time zone 'Mars/Olympus'" in bad.stderr


def test_whole_floats_are_read_and_fractions_named(tmp_path: Path) -> None:
    lines = worked_example_google()
    lines.insert(3, {**lines[2], "step": 52.5})
    lines.insert(4, {**lines[2], "node_rank": "one"})
    ledger = read_ledger([_write(tmp_path / "tracker.jsonl", lines)])
    assert len(ledger.warnings) == 2
    assert (
        ":4: Google log line skipped: step must be a whole number, got 52.5" in ledger.warnings[0]
    )
    assert ":5: " in ledger.warnings[1] and "node_rank must be a number" in ledger.warnings[1]
    nodes = {ev.data["node"] for ev in ledger.events if ev.event == "checkpoint_saved"}
    assert nodes <= {"0", "1"}  # 1.0 is node "1", not "1.0"
    assert compute(ledger, 120.0).whole.goodput == pytest.approx(0.5)


def test_googles_figure_is_zero_without_a_load(tmp_path: Path) -> None:
    lines = [x for x in worked_example_google() if x["event_type"] != "checkpoint_loaded"]
    report = compute(read_ledger([_write(tmp_path / "tracker.jsonl", lines)]), 120.0)
    assert report.google_figure == google_calculator(lines, 120.0)["goodput"] == 0.0
    assert "gives 0 % to a log with no checkpoint_loaded" in render_text(report)


def test_a_growing_google_log_read_incrementally(tmp_path: Path) -> None:
    lines = sorted(large_google_job(nodes=16, restarts=4, seed=3), key=lambda x: x["timestamp"])
    path = tmp_path / "tracker.jsonl"
    reader = LedgerReader([path])
    half = len(lines) // 2
    _write(path, lines[:half])
    first = compute(reader.update(), 2.0)
    assert first.attempts
    with path.open("a", encoding="utf-8") as stream:
        stream.write("".join(json.dumps(x) + "\n" for x in lines[half:]))
    again = compute(reader.update(), 2.0)
    whole = compute(read_ledger([path]), 2.0)
    assert len(again.attempts) == len(whole.attempts) == 5
    assert again.whole.seconds == whole.whole.seconds
    assert again.google_figure == whole.google_figure == google_calculator(lines, 2.0)["goodput"]


def test_a_node_restarting_without_an_end_opens_a_cycle(tmp_path: Path) -> None:
    """A node killed hard writes no job_terminated: its next start is still a new cycle."""
    lines = [x for x in worked_example_google() if x["event_type"] != "job_terminated"]
    report = compute(read_ledger([_write(tmp_path / "tracker.jsonl", lines)]), 120.0)
    assert len(report.attempts) == 2
