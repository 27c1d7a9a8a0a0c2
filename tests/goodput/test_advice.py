"""``resiliency-goodput advise``: MTBF, costs per tier, and Daly's interval from a ledger."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from resiliency.goodput import advise, compute, read_ledger
from resiliency.goodput._render import render_advice

from ._google_logs import large_google_job
from ._ledgers import worked_example, write
from ._simulated_job import simulated_job

MTBF, BLOCKED, TOTAL, RESTORE, RESTART = 3600.0, 20.0, 30.0, 40.0, 60.0


def _daly(save_s: float, mtbf_s: float) -> float:
    """Daly (2006), written here from the paper: the test's own reference."""
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


def _job(path: Path, seed: int, save_every: int = 600, failures: int = 300) -> Path:
    return simulated_job(
        path,
        mtbf_s=MTBF,
        failures=failures,
        seed=seed,
        save_every=save_every,
        blocked_s=BLOCKED,
        total_s=TOTAL,
        restore_s=RESTORE,
        restart_s=RESTART,
    )


@pytest.fixture(scope="module")
def known_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _job(tmp_path_factory.mktemp("advise") / "job.n0.jsonl", seed=1)


def test_advice_finds_the_known_mtbf_costs_and_interval(known_job: Path) -> None:
    ledger = read_ledger([known_job])
    advice = advise(ledger, "auto")
    assert advice.enough and advice.failures == 300
    assert advice.mtbf_s == pytest.approx(MTBF, rel=0.10)
    assert advice.mtbf_low_s < advice.mtbf_s < advice.mtbf_high_s
    assert advice.restart_s == pytest.approx(RESTART, rel=0.01)
    (tier,) = advice.tiers
    assert tier.tier == "persistent" and advice.primary == "persistent"
    assert tier.save_blocked_s == BLOCKED and tier.restore_s == RESTORE
    assert tier.interval_s == pytest.approx(600.0)  # 600 steps of 1 s between saves
    assert tier.advised_interval_s == pytest.approx(_daly(BLOCKED, MTBF), rel=0.05)
    assert tier.young_interval_s == pytest.approx(math.sqrt(2 * BLOCKED * MTBF), rel=0.05)
    assert tier.goodput_advised > tier.goodput_now
    # The model predicts the goodput this very ledger measured.
    measured = compute(ledger, "auto").whole.goodput
    assert tier.goodput_now == pytest.approx(measured, abs=0.02)


def test_the_advised_interval_predicts_a_second_run(known_job: Path, tmp_path: Path) -> None:
    """Another seed, saving at the advised interval: its goodput is the one predicted."""
    first = advise(read_ledger([known_job]), "auto")
    (tier,) = first.tiers
    advised_steps = tier.steps(tier.advised_interval_s)
    assert advised_steps is not None
    second = _job(tmp_path / "job.n0.jsonl", seed=2, save_every=advised_steps)
    measured = compute(read_ledger([second]), "auto").whole.goodput
    assert tier.goodput_advised == pytest.approx(measured, abs=0.02)


def test_every_nodes_own_save_events_do_not_shorten_the_interval(
    known_job: Path, tmp_path: Path
) -> None:
    """Each node's recorder writes its own event for one save, a few ms apart and in either
    order: the interval is between one node's saves (a real 2-node benchmark ledger advised
    an interval of -0.03 s and a predicted goodput of 0 before)."""
    other = []
    for text in known_job.read_text().splitlines():
        event = json.loads(text)
        if event["event"] in ("checkpoint_saved", "checkpoint_loaded"):
            when = datetime.fromisoformat(event["time"]) - timedelta(milliseconds=30)
            other.append({**event, "node": "1", "time": when.isoformat()})
    second = write(tmp_path / "job.n1.jsonl", other)
    one, both = advise(read_ledger([known_job])), advise(read_ledger([known_job, second]))
    assert both.primary == one.primary == "persistent"
    assert both.tiers[0].interval_s == pytest.approx(one.tiers[0].interval_s, abs=0.1)
    assert both.tiers[0].advised_interval_s == pytest.approx(one.tiers[0].advised_interval_s)
    assert both.tiers[0].goodput_now == pytest.approx(one.tiers[0].goodput_now, abs=0.001)


def test_a_ledger_without_launcher_events_counts_its_restarts_as_failures(
    known_job: Path, tmp_path: Path
) -> None:
    """torchrun with only the recorder's callbacks writes no cycle_ended: a cycle that another
    follows ended in a failure; Lightning's save_last writes each save twice (step=N.ckpt,
    then last.ckpt, ms apart): one save, its blocking costs added, not a 0 s interval."""
    lines = []
    for text in known_job.read_text().splitlines():
        event = json.loads(text)
        if event["event"] in ("cycle_ended", "job_ended"):
            continue
        lines.append(event)
        if event["event"] == "checkpoint_saved":
            when = datetime.fromisoformat(event["time"]) + timedelta(milliseconds=9)
            lines.append({**event, "time": when.isoformat(), "blocked_s": 0.5, "total_s": 0.5})
    bare = write(tmp_path / "job.n0.jsonl", lines)
    known, advice = advise(read_ledger([known_job])), advise(read_ledger([bare]))
    assert advice.failures == known.failures == 300  # the last cycle is followed by none
    (tier,) = advice.tiers
    assert tier.saves == known.tiers[0].saves
    assert tier.save_blocked_s == pytest.approx(BLOCKED + 0.5)
    # Not ~0 s: the work between two saves, less the second file's 0.5 s of blocking (the
    # timeline here was not moved for it).
    assert tier.interval_s == pytest.approx(known.tiers[0].interval_s - 0.5, abs=0.1)


def test_too_few_failures_says_how_much_more_ledger(tmp_path: Path) -> None:
    path = _job(tmp_path / "job.n0.jsonl", seed=3, failures=2)
    advice = advise(read_ledger([path]), "auto")
    assert not advice.enough and advice.failures == 2
    assert advice.tiers[0].advised_interval_s is None
    expected = advice.running_s / 2 / 3600.0  # one more failure at the rate seen
    assert advice.more_hours_needed == pytest.approx(expected)
    out = subprocess.run(
        [sys.executable, "-m", "resiliency.goodput", "advise", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "Too few failures to advise: 2 seen, 3 needed" in out
    assert f"About {expected:.1f} more hour(s) of ledger" in out


def test_advise_json(known_job: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "resiliency.goodput", "advise", str(known_job), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    data = json.loads(out)
    assert data["mtbf_s"] == pytest.approx(MTBF, rel=0.10)
    assert 0 < data["goodput_now"] < data["goodput_advised"] < 1
    (tier,) = data["tiers"]
    assert tier["tier"] == "persistent" and tier["save_blocked_s"] == BLOCKED
    assert tier["interval_s"] == pytest.approx(600.0) and tier["interval_steps"] == 600
    assert tier["advised_interval_s"] == pytest.approx(_daly(BLOCKED, MTBF), rel=0.05)


def test_a_ledger_without_failures_or_saves(tmp_path: Path) -> None:
    lines = [x for x in worked_example() if x["event"] != "checkpoint_saved"]
    path = write(tmp_path / "job.n0.jsonl", lines)
    advice = advise(read_ledger([path]), 120.0)
    assert advice.failures == 1 and not advice.enough and advice.tiers == []
    assert "No checkpoint was saved: nothing to advise on." in render_advice(advice)


def test_saves_without_a_cost_get_no_interval(tmp_path: Path) -> None:
    """Google's log has no save durations: nothing to weigh, no advised interval."""
    path = tmp_path / "tracker.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in large_google_job(nodes=4, restarts=5)))
    advice = advise(read_ledger([path]), 2.0)
    assert advice.enough and advice.failures == 5
    (tier,) = advice.tiers
    assert tier.save_blocked_s == 0 and tier.advised_interval_s is None
    assert tier.restart_s == advice.restart_s is not None
    assert "persistent: its saves carry no duration" in render_advice(advice)
