"""`benchmarks/run.py --quick` runs every benchmark and writes the combined summary.

Only presence and shape are checked here: how fast things are is measured by `nox -s bench`,
never asserted in tests (a busy neighbour on the machine must not fail the suite).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("resiliency.launcher")
pytest.importorskip("resiliency.straggler")

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"

# Every figure issue 6 asks for; each must carry a number in summary.json.
FIGURES = {
    "ft_client.send_heartbeat": "us",
    "ft_client.section_pair": "us",
    "hang_monitor.detected": "s",
    "hang_monitor.hang_event": "s",
    "launcher.hang_restart": "s",
    "launcher.crash_respawn": "s",
    "launcher.start": "s",
    "straggler.detection_section": "us",
    "straggler.scoring_64": "ms",
    "straggler.scoring_512": "ms",
    "straggler.scoring_4096": "ms",
}
# Figures compared with plain torchrun in the same run.
AGAINST_TORCHRUN = ("launcher.hang_restart", "launcher.crash_respawn", "launcher.start")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Run the quick benchmarks once; stop them (by pid) if they overrun."""
    results = tmp_path_factory.mktemp("bench")
    proc = subprocess.Popen(
        [sys.executable, str(RUN), "--quick", "--results", str(results)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # run.py stops the benchmark it is running
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert proc.returncode == 0, out[-6000:]
    return results, out


def test_summary_json_has_every_figure_with_a_number(quick_run: tuple[Path, str]) -> None:
    results, _ = quick_run
    summary = json.loads((results / "summary.json").read_text())
    assert summary["quick"] is True
    assert summary["missing"] == []
    figures = {f["key"]: f for f in summary["figures"]}
    assert set(FIGURES) <= set(figures), sorted(set(FIGURES) - set(figures))
    for key, unit in FIGURES.items():
        figure = figures[key]
        assert figure["unit"] == unit, key
        for field in ("median", "low", "high"):
            assert isinstance(figure[field], float) and math.isfinite(figure[field]), (key, field)
        assert figure["low"] <= figure["median"] <= figure["high"], key
        assert figure["n"] >= 1 and figure["failed"] == 0, key
        assert figure["title"] and (figure["target_text"] or figure["comparison_text"]), key
        assert figure["ok"] in (True, False, None), key
    for key in AGAINST_TORCHRUN:
        assert figures[key]["comparison_label"] == "torchrun", key
    # torchrun has no hang detection, so it is never restarted on a hang: no number, by design.
    assert figures["launcher.hang_restart"]["comparison"]["median"] is None
    for key in ("launcher.crash_respawn", "launcher.start"):
        assert isinstance(figures[key]["comparison"]["median"], float), key
        assert isinstance(figures[key]["extra"]["difference_s"], float), key


def test_each_benchmark_kept_its_own_results(quick_run: tuple[Path, str]) -> None:
    results, _ = quick_run
    for name in ("ft_client", "straggler", "hang_monitor", "launcher"):
        assert json.loads((results / f"{name}.json").read_text()), name


def test_chart_is_a_png(quick_run: tuple[Path, str]) -> None:
    results, _ = quick_run
    chart = (results / "summary.png").read_bytes()
    assert chart.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(chart) > 10_000  # four panels, not an empty canvas


def test_combined_table_is_printed_with_every_figure(quick_run: tuple[Path, str]) -> None:
    _, out = quick_run
    table = out.split("# Combined results", 1)[1]
    for title in (
        "send_heartbeat()",
        "start_section + end_section",
        "monitor detects",
        "hang event",
        "all workers running again",
        "crash -> all workers respawned",
        "launcher start -> first worker running",
        "detection_section",
        "scoring 64 ranks",
        "scoring 512 ranks",
        "scoring 4,096 ranks",
    ):
        assert title in table, title
