"""The calculator: the field's worked example exactly, hangs, windows and attempts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resiliency.goodput import CATEGORIES, GoodputError, compute, read_ledger
from resiliency.goodput.calculator import _median_deviation

from ._ledgers import MIN, line, worked_example, write

EXPECTED_MIN = {
    "productive": 100.0,
    "startup": 0.0,
    "loading": 10.0,
    "saving": 10.0,
    "lost_progress": 40.0,
    "restart": 15.0,
    "slowdown": 25.0,
    "idle": 0.0,
}


def _report(tmp_path: Path, lines, reference="auto", window=None):
    return compute(read_ledger([write(tmp_path / "n0.jsonl", lines)]), reference, window)


@pytest.mark.parametrize("dense", [False, True], ids=["sampled-steps", "every-step"])
@pytest.mark.parametrize("reference", [120.0, "auto"])
def test_worked_example_every_figure_exact(tmp_path: Path, dense: bool, reference) -> None:
    report = _report(tmp_path, worked_example(dense), reference)
    whole = report.whole
    assert whole.total == 200 * MIN
    assert {k: v / MIN for k, v in whole.seconds.items()} == EXPECTED_MIN
    assert whole.goodput == 0.5
    assert whole.hang_detection == 0.0
    assert report.ideal_step_time_s == 120.0
    assert report.ideal_source == ("auto" if reference == "auto" else "given")
    assert (report.initial_step, report.final_step) == (25, 75)
    assert not report.warnings
    first, second = report.attempts
    assert (first.cycle, first.cause, first.restore_step, first.last_step) == (0, "crash", 25, 70)
    assert {k: v / MIN for k, v in first.breakdown.seconds.items() if v} == {
        "productive": 50.0,
        "loading": 5.0,
        "saving": 5.0,
        "lost_progress": 40.0,
        "restart": 15.0,
    }
    assert (second.cycle, second.cause, second.restore_step) == (1, "success", 50)
    assert {k: v / MIN for k, v in second.breakdown.seconds.items() if v} == {
        "productive": 50.0,
        "loading": 5.0,
        "saving": 5.0,
        "slowdown": 25.0,
    }


def test_categories_sum_to_the_total_in_every_row(tmp_path: Path) -> None:
    report = _report(tmp_path, worked_example(), window=3600.0)
    rows = [report.whole, *(a.breakdown for a in report.attempts), *report.windows]
    for row in rows:
        assert sum(row.seconds.values()) == pytest.approx(row.total, abs=1e-6)
    assert tuple(report.whole.seconds) == CATEGORIES


def test_rolling_windows(tmp_path: Path) -> None:
    report = _report(tmp_path, worked_example(), window=3600.0)
    assert [w.total / MIN for w in report.windows] == [60.0, 60.0, 60.0, 20.0]
    first, second, third, last = (
        {k: v / MIN for k, v in w.seconds.items() if v} for w in report.windows
    )
    assert first == {"productive": 50.0, "loading": 5.0, "saving": 5.0}
    assert second == {"loading": 5.0, "lost_progress": 40.0, "restart": 15.0}
    assert third == pytest.approx({"productive": 40.0, "slowdown": 20.0})
    assert last == pytest.approx({"productive": 10.0, "slowdown": 5.0, "saving": 5.0})
    assert sum(w.seconds["productive"] for w in report.windows) == pytest.approx(100 * MIN)


def _hang_job() -> list[dict]:
    """Steps of 1 min; rank 1 hangs after step 30 (minute 30); detected at 40 (timeout 9, +1)."""
    w = dict(rank=0)
    out = [line("job_started", 0), line("cycle_started", 0, cycle=0)]
    out += [line("step", float(s), step=s, **w) for s in (1, 10, 20, 30)]
    out.append(
        line(
            "checkpoint_saved",
            20.5,
            step=20,
            tier="persistent",
            bytes=1,
            blocked_s=0.0,
            total_s=10.0,
            **w,
        )
    )
    out.append(
        line("hang_detected", 40, rank=1, timer="heartbeat", latency_s=60.0, timeout_s=540.0)
    )
    out.append(line("cycle_ended", 41, cycle=0, cause="hang", timer="heartbeat", ranks=[1]))
    out.append(line("cycle_started", 42, cycle=1, attempt=1))
    w1 = dict(rank=0, attempt=1)
    out.append(
        line("checkpoint_loaded", 44, step=20, tier="persistent", bytes=1, duration_s=60.0, **w1)
    )
    out += [line("step", 44.0 + (s - 20), step=s, **w1) for s in (21, 40, 60)]
    out.append(line("job_ended", 60 + 24, exit_code=0, reason="success", attempt=1))
    return out


def test_hang_detection_is_its_own_part_of_restart(tmp_path: Path) -> None:
    report = _report(tmp_path, _hang_job(), reference=60.0)
    got = {k: v / MIN for k, v in report.whole.seconds.items() if v}
    # The hang began at 30 (40 - 9 - 1): detection 10 min, then 2 min to the cycle start,
    # 1 more until the load began at 43; steps 21..30 were redone: 10 min lost.
    assert report.whole.hang_detection / MIN == pytest.approx(10.0)
    assert got == pytest.approx(
        {"productive": 60.0, "loading": 1.0, "lost_progress": 10.0, "restart": 13.0}
    )
    assert report.attempts[0].cause == "hang" and report.attempts[0].timer == "heartbeat"
    assert report.whole.goodput == pytest.approx(60 / 84)


def test_a_cycle_without_a_checkpoint_counts_its_first_step(tmp_path: Path) -> None:
    lines = [line("job_started", 0)] + [line("step", 5.0 + s, step=s, rank=0) for s in (1, 5, 9)]
    report = _report(tmp_path, lines, reference=60.0)
    got = {k: v / MIN for k, v in report.whole.seconds.items() if v}
    # Steps 2..9 in 8 min; step 1 is one ideal minute of the 6 before it, the rest start-up.
    assert got == pytest.approx({"productive": 9.0, "startup": 5.0})


def test_empty_and_bad_arguments(tmp_path: Path) -> None:
    report = _report(tmp_path, [line("job_started", 0)])
    assert report.whole.total == 0 and report.whole.goodput == 0
    with pytest.raises(GoodputError, match="positive"):
        _report(tmp_path, worked_example(), reference=-1.0)
    with pytest.raises(GoodputError, match="seconds or 'auto'"):
        _report(tmp_path, worked_example(), reference="fast")
    with pytest.raises(GoodputError, match="no such ledger"):
        read_ledger([tmp_path / "missing"])


def test_auto_ideal_ignores_outliers(tmp_path: Path) -> None:
    # 1-min steps, plus one 50-min stretch of 5 steps (10 min each): an outlier above 3 MAD.
    lines = [
        line("job_started", 0),
        line("checkpoint_loaded", 1, step=0, tier="local", bytes=0, duration_s=60.0, rank=0),
    ]
    lines += [line("step", 1.0 + s, step=s, rank=0) for s in range(1, 21)]
    lines.append(line("step", 71, step=25, rank=0))
    report = _report(tmp_path, lines)
    assert report.ideal_step_time_s == pytest.approx(60.0)
    assert report.whole.seconds["slowdown"] / MIN == pytest.approx(45.0)


def _two_node_job() -> list[dict]:
    """Two nodes; node 1, then node 0, preempted and replaced by a fresh launcher (whose own
    cycle count starts again at 0). Steps of 2 min, rank 0 writes the steps."""
    out = []
    ld = dict(tier="persistent", bytes=1)
    out += [
        line("cycle_started", 0, node="0", cycle=0),
        line("cycle_started", 1, node="1", cycle=0),
    ]
    out.append(line("checkpoint_loaded", 2, step=0, duration_s=1 * MIN, rank=0, **ld))
    out += [line("step", 2 + 2 * s, step=s, rank=0) for s in range(1, 11)]
    out.append(line("cycle_ended", 23, node="1", cycle=0, cause="preemption", timer=None, ranks=[]))
    out.append(line("cycle_ended", 24, node="0", cycle=0, cause="crash", timer=None, ranks=[]))
    out += [
        line("cycle_started", 30, node="0", cycle=1),
        line("cycle_started", 31, node="1", cycle=0),
    ]
    out.append(line("checkpoint_loaded", 34, step=8, duration_s=2 * MIN, rank=0, **ld))
    out += [line("step", 34 + 2 * (s - 8), step=s, rank=0) for s in range(9, 21)]
    out.append(line("cycle_ended", 59, node="0", cycle=1, cause="preemption", timer=None, ranks=[]))
    out.append(line("cycle_ended", 60, node="1", cycle=0, cause="crash", timer=None, ranks=[]))
    out += [
        line("cycle_started", 65, node="1", cycle=1),
        line("cycle_started", 66, node="0", cycle=0),
    ]
    out.append(line("checkpoint_loaded", 68, step=20, duration_s=1 * MIN, rank=0, **ld))
    out += [line("step", 68 + 2 * (s - 20), step=s, rank=0) for s in range(21, 31)]
    for node in ("0", "1"):
        out.append(
            line("cycle_ended", 90, node=node, cycle=0, cause="success", timer=None, ranks=[])
        )
    return out


def test_nodes_numbering_their_own_cycles_make_one_job_timeline(tmp_path: Path) -> None:
    report = _report(tmp_path, _two_node_job(), reference=120.0)
    got = {k: v / MIN for k, v in report.whole.seconds.items() if v}
    # Cycle 0: steps 9, 10 redone (4 min) and 22..23 lost; restarts 23..30 + 30..32 + 59..65 +
    # 65..67; the replaced nodes' starts (31, 66) join the restart already under way.
    assert got == pytest.approx(
        {
            "productive": 60.0,
            "startup": 1.0,
            "loading": 4.0,
            "lost_progress": 6.0,
            "restart": 17.0,
            "idle": 2.0,
        }
    )
    rows = [(a.cycle, a.cause, a.restore_step, a.last_step) for a in report.attempts]
    assert rows == [(0, "preemption", 0, 10), (1, "preemption", 8, 20), (2, "success", 20, 30)]
    assert report.final_step == 30


def test_a_node_starting_twice_without_progress_opens_a_new_cycle(tmp_path: Path) -> None:
    lines = [
        line("cycle_started", 0, node="0", cycle=0),
        line("cycle_ended", 2, node="0", cycle=0, cause="crash", timer=None, ranks=[]),
        line("cycle_started", 3, node="0", cycle=1),
        line("step", 5, step=1, rank=0),
        line("step", 9, step=3, rank=0),
    ]
    report = _report(tmp_path, lines, reference=120.0)
    assert [(a.cycle, a.cause) for a in report.attempts] == [(0, "crash"), (1, None)]


@given(st.lists(st.sampled_from([0.1, 0.2, 0.25, 0.3, 1.0, 7.5]) | st.floats(0, 10), min_size=1))
def test_the_median_deviation_equals_the_plain_computation(raw: list[float]) -> None:
    values = sorted(raw)
    median = values[math.ceil(len(values) / 2) - 1]
    deviations = sorted(abs(v - median) for v in values)
    expected = deviations[math.ceil(len(deviations) / 2) - 1]
    assert _median_deviation(values, median) == expected


def test_without_launcher_events_a_rank_changing_its_restart_count_starts_a_cycle(
    tmp_path: Path,
) -> None:
    # torchrun writes nothing: only the workers' restart counts show the restarts. Rank 0's
    # node restarts its workers (0 -> 1), then is replaced by a fresh launcher (1 -> 0 again).
    ld = dict(tier="persistent", bytes=1)
    lines = [line("checkpoint_load_started", 0, rank=0, tier="persistent")]
    for rank in (0, 1):
        lines.append(line("checkpoint_loaded", 2, step=0, duration_s=MIN, rank=rank, **ld))
    lines += [line("step", 2 + 2 * s, step=s, rank=0) for s in range(1, 11)]
    for rank, attempt in ((0, 1), (1, 0)):
        lines.append(
            line(
                "checkpoint_loaded",
                30,
                step=8,
                duration_s=2 * MIN,
                rank=rank,
                attempt=attempt,
                **ld,
            )
        )
    lines += [line("step", 30 + 2 * (s - 8), step=s, rank=0, attempt=1) for s in range(9, 21)]
    for rank in (0, 1):
        lines.append(line("checkpoint_loaded", 62, step=20, duration_s=MIN, rank=rank, **ld))
    lines += [line("step", 62 + 2 * (s - 20), step=s, rank=0) for s in range(21, 26)]
    report = _report(tmp_path, lines, reference=120.0)
    got = {k: v / MIN for k, v in report.whole.seconds.items() if v}
    assert got == pytest.approx(
        {"productive": 50.0, "startup": 1.0, "loading": 4.0, "lost_progress": 4.0, "restart": 13.0}
    )
    assert [(a.restore_step, a.last_step) for a in report.attempts] == [(0, 10), (8, 20), (20, 25)]
