"""Issue 30 (goodput): a job without step events, a directory without a ledger, a bad --plot
path, and a plot whose legend covered a lane and whose two jobs both read ``node vm``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resiliency.goodput import compute, read_ledger

from ._google_logs import large_google_job
from ._ledgers import MIN, line, worked_example, write

CLI = [sys.executable, "-m", "resiliency.goodput"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], check=False, capture_output=True, text=True, timeout=60)


def _without_steps(with_save_starts: bool) -> list[dict[str, object]]:
    """The worked example as a loop with CheckpointManager but no ``recorder.step()`` writes."""
    out = [x for x in worked_example() if x["event"] != "step"]
    if with_save_starts:  # what CheckpointManager writes when a save begins
        for minute, step, attempt in ((55, 50, 0), (195, 75, 1)):
            start = line(
                "checkpoint_save_started",
                minute,
                step=step,
                tier="persistent",
                rank=0,
                attempt=attempt,
            )
            at = next(i for i, x in enumerate(out) if x["time"] > start["time"])
            out.insert(at, start)
    return out


@pytest.mark.parametrize("with_save_starts", [False, True])
def test_committed_checkpoints_are_progress_without_step_events(
    tmp_path: Path, with_save_starts: bool
) -> None:
    path = write(tmp_path / "job.n0.jsonl", _without_steps(with_save_starts))
    report = compute(read_ledger([path]), 2 * MIN)
    assert report.step_events == 0
    assert (report.initial_step, report.final_step) == (25, 75)
    # The saves fall where the worked example's step events of 50 and 75 were: the same 50 %.
    assert report.whole.goodput == pytest.approx(0.5)
    assert report.whole.seconds["lost_progress"] == pytest.approx(40 * MIN)
    assert len(report.hints) == 1 and "get_recorder().step(step)" in report.hints[0]
    out = _run("report", str(path), "--reference-step-time", "120").stdout
    assert "Steps: from 25 to 75 (50 new steps kept)" in out and "Goodput: 50.0 %" in out
    assert "Hint: no step events in the ledger" in out


def test_a_ledger_with_steps_gets_no_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "job.n0.jsonl", worked_example())
    assert compute(read_ledger([path]), "auto").hints == []


def test_a_directory_without_a_ledger_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "goodput"
    empty.mkdir()
    png = tmp_path / "out.png"
    result = _run("report", str(empty), "--plot", str(png))
    assert result.returncode == 2
    assert f"no ledger in {empty}: no *.jsonl file there" in result.stderr
    assert "--goodput-dir" in result.stderr and "0 file(s)" not in result.stdout
    assert not png.exists()


def test_a_plot_into_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "job.n0.jsonl", worked_example())
    target = tmp_path / "nonexistent" / "x.png"
    result = _run("report", str(path), "--plot", str(target))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"the directory {target.parent} does not exist" in result.stderr
    assert result.stdout == ""  # failed before any work


def test_nothing_to_plot_writes_no_png(tmp_path: Path) -> None:
    path = write(tmp_path / "job.n0.jsonl", [line("job_started", 0)])
    png = tmp_path / "x.png"
    result = _run("report", str(path), "--plot", str(png))
    assert result.returncode == 2 and "nothing to plot" in result.stderr
    assert not png.exists()


def test_lane_names_tell_two_jobs_on_one_host_apart() -> None:
    pytest.importorskip("matplotlib")
    from resiliency.goodput._plot import lane_names  # noqa: PLC0415 -- the plot extra

    assert lane_names(["d/train.vm.jsonl", "d/train.vm2.jsonl"]) == ["node vm", "node vm2"]
    assert lane_names(["d/jobA.vm.jsonl", "d/jobB.vm.jsonl"]) == ["jobA @ vm", "jobB @ vm"]


def test_the_legend_covers_no_lane(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from resiliency.goodput._plot import draw_report  # noqa: PLC0415 -- the plot extra

    lines = worked_example()
    other = [{**x, "job": "jobB", "node": "vm"} for x in lines]
    write(tmp_path / "jobA.vm.jsonl", [{**x, "job": "jobA", "node": "vm"} for x in lines])
    write(tmp_path / "jobB.vm.jsonl", other)
    ledger = read_ledger([tmp_path])
    figure = draw_report(compute(ledger, "auto"), ledger)
    figure.canvas.draw()
    lanes = figure.axes[0]
    labels = [t.get_text() for t in lanes.get_yticklabels()]
    assert labels == ["time use", "jobA @ vm", "jobB @ vm"]
    legend = lanes.get_legend().get_window_extent()
    assert legend.x0 >= lanes.get_window_extent().x1  # beside the lanes, not over them


def test_many_cycles_get_labels_that_fit(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from resiliency.goodput._plot import draw_report  # noqa: PLC0415 -- the plot extra

    path = tmp_path / "tracker.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in large_google_job(nodes=4, restarts=30)))
    ledger = read_ledger([path])
    figure = draw_report(compute(ledger, 2.0), ledger)
    labels = [t.get_text().strip() for t in figure.axes[0].texts]
    assert len(labels) <= 20 and labels[:3] == ["0", "2", "4"]
