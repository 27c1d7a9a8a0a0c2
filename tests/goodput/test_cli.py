"""The resiliency-goodput command line, run as a subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ._ledgers import line, worked_example, write

CLI = [sys.executable, "-m", "resiliency.goodput"]


def _run(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, *args], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == expect, result.stderr
    return result


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "ledger"
    directory.mkdir()
    write(directory / "job.node0.jsonl", worked_example())
    return directory


def test_report_text(ledger_dir: Path) -> None:
    out = _run("report", str(ledger_dir), "--reference-step-time", "120").stdout
    for expected in (
        "Goodput: 50.0 %",
        "Ideal step time: 120 s (given)",
        "Steps: from 25 to 75 (50 new steps kept)",
        "checkpoint loading                 10m 00s    5.0 %",
        "checkpoint saving (blocking)       10m 00s    5.0 %",
        "lost progress                      40m 00s   20.0 %",
        "restart & recovery                 15m 00s    7.5 %",
        "slowdown                           25m 00s   12.5 %",
        "total                           3h 20m 00s  100.0 %",
        "#0 crash",
        "#1 success",
    ):
        assert expected in out, out


def test_report_json_with_windows(ledger_dir: Path) -> None:
    out = _run("report", str(ledger_dir), "--json", "--window", "1h").stdout
    data = json.loads(out)
    assert data["goodput"] == 0.5
    assert data["ideal_step_time_s"] == 120.0 and data["ideal_step_time_source"] == "auto"
    assert data["seconds"]["lost_progress"] == 2400.0
    assert data["total_s"] == 12000.0
    assert len(data["windows"]) == 4 and len(data["attempts"]) == 2
    assert data["attempts"][0]["cause"] == "crash"


def test_report_warnings_go_to_stderr(ledger_dir: Path) -> None:
    with (ledger_dir / "job.node0.jsonl").open("a") as stream:
        stream.write("garbage\n")
    result = _run("report", str(ledger_dir))
    assert (
        "warning: " in result.stderr
        and ":20: malformed line skipped (Expecting value): 'garbage'" in result.stderr
    )
    assert "Goodput: 50.0 %" in result.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the plot extra) missing"
)
def test_report_plot(ledger_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    _run("report", str(ledger_dir), "--plot", str(png))
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_usage_errors(ledger_dir: Path, tmp_path: Path) -> None:
    assert "no such ledger" in _run("report", str(tmp_path / "x"), expect=2).stderr
    assert (
        "seconds or 'auto'"
        in _run("report", str(ledger_dir), "--reference-step-time", "soon", expect=2).stderr
    )
    assert "not a duration" in _run("report", str(ledger_dir), "--window", "1x", expect=2).stderr


def test_watch_prints_live_figures(tmp_path: Path) -> None:
    directory = tmp_path / "live"
    directory.mkdir()
    path = write(directory / "job.n.jsonl", [line("job_started", 0)])
    proc = subprocess.Popen(
        [*CLI, "watch", str(directory), "--interval", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []

    def read_until(needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = proc.stdout.readline()  # one line every 0.3 s while it runs
            if not text:
                break
            lines.append(text)
            if needle in text:
                return
        raise AssertionError(f"no {needle!r} in the watch output: {lines}")

    try:
        read_until("goodput 0.0 %")
        with path.open("a") as stream:  # the job goes on while watched
            for x in worked_example()[1:]:
                stream.write(json.dumps(x) + "\n")
        read_until("goodput 50.0 %")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, err
    assert "step 75" in lines[-1] and "attempt 1" in lines[-1]


def test_progress_is_shown_for_large_ledgers(capsys: pytest.CaptureFixture[str]) -> None:
    from resiliency.goodput.cli import PROGRESS_MIN_BYTES, _Progress  # noqa: PLC0415

    progress = _Progress()
    progress.tty = False
    progress(10, 1000)  # a small ledger: nothing
    assert capsys.readouterr().err == ""
    total = 4 * PROGRESS_MIN_BYTES
    for percent in range(101):
        progress(percent * total // 100, total)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("reading ledger:   0 % of") and lines[-1].startswith(
        "reading ledger: 100 %"
    )
    assert len(lines) == 5  # every quarter off a terminal
