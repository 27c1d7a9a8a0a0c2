"""Import of Google Cloud Resiliency's event log, with Google's own figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resiliency.goodput import compute, read_ledger

# A small hand-written log: the job runs from scratch, is terminated at 600 s, restarts,
# loads step 40 and finishes at 1000 s. Steps take 12 s, except steps 21..40 (10 s).
GOOGLE_LOG = [
    {"event_type": "user_scheduled", "timestamp": "2026-11-23T00:00:00Z", "job_name": "g"},
    {
        "event_type": "job_started",
        "timestamp": "2026-11-23T00:01:00Z",
        "job_name": "g",
        "node_rank": 0,
    },
    {
        "event_type": "checkpoint_saved",
        "timestamp": "2026-11-23T00:05:00Z",
        "job_name": "g",
        "step": 20,
    },
    {
        "event_type": "checkpoint_saved",
        "timestamp": "2026-11-23T00:08:20Z",
        "job_name": "g",
        "step": 40,
    },
    {"event_type": "job_terminated", "timestamp": "2026-11-23T00:10:00Z", "job_name": "g"},
    {"event_type": "job_started", "timestamp": "2026-11-23T00:11:40Z", "job_name": "g"},
    {
        "event_type": "checkpoint_loaded",
        "timestamp": "2026-11-23T00:12:40Z",
        "job_name": "g",
        "step": 40,
    },
    {
        "event_type": "checkpoint_saved",
        "timestamp": "2026-11-23T00:16:40Z",
        "job_name": "g",
        "step": 60,
    },
    {"event_type": "job_terminated", "timestamp": "2026-11-23T00:16:40Z", "job_name": "g"},
    {"event_type": "user_terminated", "timestamp": 1795392000.0 + 1000, "job_name": "g"},
]


@pytest.fixture
def google_log(tmp_path: Path) -> Path:
    path = tmp_path / "google.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in GOOGLE_LOG), encoding="utf-8")
    return path


def test_google_log_figures(google_log: Path) -> None:
    ledger = read_ledger([google_log])
    assert not ledger.warnings
    report = compute(ledger, 10.0)
    # Google: (60 - 40) x 10 s / 1000 s.
    assert report.google_figure == pytest.approx(0.20)
    seconds = report.whole.seconds
    assert report.whole.total == pytest.approx(1000.0)
    assert seconds == pytest.approx(
        {
            "productive": 600.0,  # 60 steps kept x 10 s
            "startup": 60.0,  # scheduled -> started
            "loading": 0.0,
            "saving": 0.0,
            "lost_progress": 100.0,  # after the save of step 40 until the termination
            "restart": 160.0,  # termination -> restart -> load
            "slowdown": 80.0,  # 40 steps at 12 s instead of 10
            "idle": 0.0,
        }
    )
    assert [a.cause for a in report.attempts] == ["crash", "success"]


def test_google_log_report_prints_both_figures(google_log: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "resiliency.goodput",
            "report",
            str(google_log),
            "--reference-step-time",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "Goodput: 60.0 %" in out
    assert "Google Cloud Resiliency's figure: 20.0 %" in out


def test_bad_google_lines_are_named(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    lines = [
        *GOOGLE_LOG[:3],
        {"event_type": "job_exploded", "timestamp": 1.0},
        {"event_type": "checkpoint_saved", "timestamp": "2026-11-23T00:05:00Z"},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    warnings = read_ledger([path]).warnings
    assert warnings[0].startswith(f"{path}:4: Google log line skipped: unknown Google event_type")
    assert warnings[1].startswith(f"{path}:5: ") and "integer step" in warnings[1]


def test_google_log_read_incrementally(tmp_path: Path) -> None:
    from resiliency.goodput import LedgerReader  # noqa: PLC0415

    path = tmp_path / "google.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in GOOGLE_LOG[:5]), encoding="utf-8")
    reader = LedgerReader([path])
    first = compute(reader.update(), 10.0)
    assert [a.cause for a in first.attempts] == ["success"]  # terminated, not (yet) restarted
    with path.open("a", encoding="utf-8") as stream:
        stream.write("".join(json.dumps(x) + "\n" for x in GOOGLE_LOG[5:]))
    again = compute(reader.update(), 10.0)
    whole = compute(read_ledger([path]), 10.0)
    assert [a.cause for a in again.attempts] == ["crash", "success"]
    assert again.whole.seconds == whole.whole.seconds
    assert again.google_figure == pytest.approx(0.20)
