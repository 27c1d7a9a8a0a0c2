"""Report history files and the PNG heatmap (function and command line)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from resiliency.straggler import (
    KernelStats,
    Report,
    ReportHistoryError,
    SectionSummary,
    StragglerError,
    Thresholds,
    append_report,
    load_reports,
    render_heatmap,
)
from resiliency.straggler.heatmap import heatmap_panels, main

RANKS = 16


def _history() -> list[Report]:
    """Ten reports over 16 ranks; rank 5 (node n1) slows down in "fwd" from the 4th report."""
    reports = []
    for index in range(10):
        fwd = {r: (0.45 if r == 5 and index >= 3 else 0.97) for r in range(RANKS)}
        data = {r: 0.9 for r in range(RANKS) if r != 9}  # rank 9 has no samples in "data"
        reports.append(
            Report(
                section_relative_perf_scores={"fwd": fwd, "data": data},
                section_individual_perf_scores={"fwd": {r: 1.0 for r in range(RANKS)}},
                gpu_relative_perf_scores={r: (0.6 if r == 5 else 1.0) for r in range(RANKS)},
                rank_to_node={r: f"n{r // 4}" for r in range(RANKS)},
                local_section_summaries={"fwd": SectionSummary(3, 1.0, 3.0, 2.0, 2.0)},
                local_kernel_summaries={"gemm": KernelStats(4, 1.0, 2.0, 1.5, 1.5)},
                created_at=1000.0 + 60.0 * index,
                thresholds=Thresholds(section_rel_threshold=0.5),
            )
        )
    return reports


def test_history_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    reports = _history()
    for report in reports:
        append_report(path, report)
    # repr, not ==: a one-sample summary's std is NaN (as NVRx's), and NaN != NaN (on 3.13
    # dataclasses compare field by field, without the identity shortcut of tuple comparison).
    assert repr(load_reports(path)) == repr(reports)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no report"),
        ("{not json\n", ":1:"),
        ('{"format": 2}\n', "format 1"),
    ],
)
def test_malformed_history_names_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(content)
    with pytest.raises(ReportHistoryError, match=message):
        load_reports(path)
    with pytest.raises(ReportHistoryError, match="cannot read"):
        load_reports(tmp_path / "absent.jsonl")


def test_bad_field_in_a_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    append_report(path, _history()[0])
    doc = json.loads(path.read_text())
    doc["gpu_relative_perf_scores"] = {"x": 1.0}
    path.write_text(path.read_text() + json.dumps(doc) + "\n")
    with pytest.raises(ReportHistoryError, match=r"h\.jsonl:2: .*not an integer"):
        load_reports(path)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_heatmap_renders_a_png_of_the_expected_size(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    reports = _history()
    assert heatmap_panels(reports) == ["GPU", "data", "fwd"]
    out = tmp_path / "heatmap.png"
    size = render_heatmap(reports, out, dpi=80, width_in=10, panel_height_in=2.5)
    assert size == (800, 600)
    assert _png_size(out) == (800, 600)


def test_heatmap_cli_renders_selected_sections(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    history = tmp_path / "history.jsonl"
    for report in _history():
        append_report(history, report)
    out = tmp_path / "cli.png"
    assert main([str(history), "-o", str(out), "--section", "fwd", "--dpi", "50"]) == 0
    assert _png_size(out) == (500, 125)


def test_heatmap_cli_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    history = tmp_path / "history.jsonl"
    append_report(history, Report())  # no scores at all
    done = subprocess.run(
        [sys.executable, "-m", "resiliency.straggler", str(history)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "holds relative scores" in done.stderr or "none of the 1 reports" in done.stderr
    assert "Traceback" not in done.stderr


def test_heatmap_refuses_an_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(StragglerError, match="kind"):
        render_heatmap(_history(), tmp_path / "x.png", kind="absolute")  # type: ignore[arg-type]
