"""One quick run of `benchmarks/run.py` on two benchmarks, checked for what can be wrong.

`run.py --quick ft_client launcher` (about 30 s) covers both kinds of figure: those judged
against a target (the client's hot-path cost, the hang restart) and those compared with plain
torchrun measured in the same run. How fast things are is measured by `nox -s bench`, never
asserted here (a busy neighbour on the machine must not fail the suite); what is asserted is that
the summary is complete, its numbers are sane and agree with the raw runs, and every verdict
agrees with the target it states.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("resiliency.launcher")

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
BENCHMARKS = ["ft_client", "launcher"]
# The figures of those benchmarks, their unit, and the runs each has in a quick run.
FIGURES = {
    "ft_client.send_heartbeat": ("us", 3),
    "ft_client.section_pair": ("us", 3),
    "launcher.hang_restart": ("s", 1),
    "launcher.crash_respawn": ("s", 1),
    "launcher.start": ("s", 1),
}
LAUNCHER_FIGURES = ("launcher.hang_restart", "launcher.crash_respawn", "launcher.start")
# The summary's scenario name in launcher.json for each launcher figure.
SCENARIO = {
    "launcher.hang_restart": "hang",
    "launcher.crash_respawn": "crash",
    "launcher.start": "start",
}
CRASH_MARGIN_S = 0.1  # the crash respawn target: within torchrun + 0.1 s


class QuickRun:
    """The results folder, the combined output and the parsed summary of the run."""

    def __init__(self, results: Path, out: str) -> None:
        self.results = results
        self.out = out
        self.summary: dict[str, Any] = json.loads((results / "summary.json").read_text())
        self.figures: dict[str, dict[str, Any]] = {f["key"]: f for f in self.summary["figures"]}

    def raw(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.results / f"{name}.json").read_text())
        return data


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> QuickRun:
    """Run the quick benchmarks once; stop them (by pid) if they overrun."""
    results = tmp_path_factory.mktemp("bench")
    proc = subprocess.Popen(
        [sys.executable, str(RUN), "--quick", *BENCHMARKS, "--results", str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # run.py stops the benchmark it is running
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    # Non-zero when a benchmark failed or one of its figures has no number.
    assert proc.returncode == 0, out[-6000:]
    return QuickRun(results, out)


def test_the_summary_holds_exactly_the_figures_of_the_benchmarks_run(run: QuickRun) -> None:
    assert run.summary["quick"] is True
    assert run.summary["benchmarks"] == BENCHMARKS
    assert run.summary["missing"] == []
    assert set(run.figures) == set(FIGURES)
    for name in BENCHMARKS:
        assert run.raw(name), name


@pytest.mark.parametrize("key", sorted(FIGURES))
def test_each_figure_is_a_finite_positive_median_within_its_spread(run: QuickRun, key: str) -> None:
    figure = run.figures[key]
    unit, runs = FIGURES[key]
    assert figure["unit"] == unit
    assert (figure["n"], figure["failed"]) == (runs, 0)
    low, median, high = figure["low"], figure["median"], figure["high"]
    assert all(isinstance(v, float) and math.isfinite(v) for v in (low, median, high)), figure
    assert 0 < low <= median <= high, figure
    assert figure["spread"] == "min-max"


def test_the_figures_are_the_medians_of_the_raw_runs(run: QuickRun) -> None:
    client = run.raw("ft_client")
    for name in ("send_heartbeat", "section_pair"):
        runs = client[f"{name}_runs_us"]
        figure = run.figures[f"ft_client.{name}"]
        assert figure["median"] == pytest.approx(statistics.median(runs))
        assert (figure["low"], figure["high"]) == (
            pytest.approx(min(runs)),
            pytest.approx(max(runs)),
        )
        blocking = client["blocking_round_trip_runs_us"]
        assert figure["comparison"]["median"] == pytest.approx(statistics.median(blocking))
    launcher = run.raw("launcher")["results"]
    for key in LAUNCHER_FIGURES:
        scenario = launcher[SCENARIO[key]]
        assert run.figures[key]["median"] == pytest.approx(
            statistics.median(scenario["ft-launcher"])
        )


def test_a_hang_restart_takes_at_least_the_heartbeat_timeout(run: QuickRun) -> None:
    # Measured from the last heartbeat: the monitor cannot see the hang before the timeout.
    timeout = run.raw("launcher")["heartbeat_timeout_s"]
    assert run.figures["launcher.hang_restart"]["low"] >= timeout


def test_every_verdict_agrees_with_the_target_it_states(run: QuickRun) -> None:
    for key, figure in run.figures.items():
        target = figure["target"]
        if target is not None:
            assert figure["target_text"].startswith(f"<= {target:g} {figure['unit']}"), key
            assert figure["ok"] is (figure["median"] <= target), key
    crash = run.figures["launcher.crash_respawn"]
    assert crash["target"] is None and crash["target_text"] == f"<= torchrun + {CRASH_MARGIN_S:g} s"
    difference = crash["extra"]["difference_s"]
    assert difference == pytest.approx(crash["median"] - crash["comparison"]["median"])
    assert crash["ok"] is (difference <= CRASH_MARGIN_S)
    start = run.figures["launcher.start"]  # compared with torchrun, judged against nothing
    assert start["target"] is None and start["target_text"] == "" and start["ok"] is None


def test_comparisons_with_torchrun_name_both_sides(run: QuickRun) -> None:
    launcher = run.raw("launcher")
    for key in LAUNCHER_FIGURES:
        figure = run.figures[key]
        assert figure["title"].endswith("(ft-launcher)"), key
        assert figure["comparison_label"] == "torchrun", key
        assert figure["comparison_text"].startswith("torchrun"), key
    # torchrun has no hang detection: never restarted, so no number, by design.
    hang = run.figures["launcher.hang_restart"]
    assert hang["comparison"]["median"] is None and hang["comparison"]["failed"] == 1
    wait = launcher["torchrun_hang_wait_s"]
    assert hang["comparison_text"] == f"torchrun: never restarted (watched {wait:g} s)"
    for key in ("launcher.crash_respawn", "launcher.start"):
        figure = run.figures[key]
        torchrun = launcher["results"][SCENARIO[key]]["torchrun"]
        theirs = figure["comparison"]["median"]
        assert theirs == pytest.approx(statistics.median(torchrun)) and theirs > 0, key
        assert f"{figure['median'] / theirs:.2f}x" in figure["comparison_text"], key
        assert figure["extra"]["difference_s"] == pytest.approx(figure["median"] - theirs), key


def test_the_printed_table_has_every_figure_and_its_verdict(run: QuickRun) -> None:
    table = run.out.split("# Combined results", 1)[1]
    for key, figure in run.figures.items():
        (row,) = [line for line in table.splitlines() if line.startswith(figure["title"])]
        verdict = {True: "ok", False: "NOT MET", None: "-"}[figure["ok"]]
        assert row.rstrip().endswith(f"  {verdict}"), (key, row)
        assert f"  {figure['n']}  " in row, (key, row)


def test_the_chart_is_a_png(run: QuickRun) -> None:
    pytest.importorskip("matplotlib")
    chart = (run.results / "summary.png").read_bytes()
    assert chart.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(chart) > 10_000  # panels with bars, not an empty canvas
