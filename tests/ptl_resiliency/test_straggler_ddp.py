"""Two DDP ranks over gloo, rank 1 three times slower: flagged, logged to CSV, both ranks stop."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from ptl_harness import JOB, Jobs, job_result


@pytest.mark.slow
def test_slow_rank_is_flagged_logged_and_stops_all_ranks(jobs: Jobs, tmp_path: Path) -> None:
    work = tmp_path / "run"
    max_steps = 400
    code, out = jobs.run(
        [
            str(JOB),
            "--work-dir", str(work),
            "--ft", "none",
            "--devices", "2",
            "--straggler",
            "--straggler-interval", "1.0",
            "--slow-rank", "1",
            "--slow-factor", "3",
            "--step-time", "0.02",
            "--max-steps", str(max_steps),
            "--ckpt-every", "1000",
            "--stop-if-detected",
        ],
        timeout=120,
    )  # fmt: skip
    assert code == 0, out[-6000:]
    # Rank 0 names rank 1 (and only rank 1) in its straggler warning.
    flagged = [
        line.split("straggler detected: ")[1]
        for line in out.splitlines()
        if "straggler detected" in line
    ]
    assert flagged, out[-6000:]
    assert all(" on rank 1 " in text and "rank 0" not in text for text in flagged), flagged
    # Both ranks stopped at the same step, well before max_steps, after a checkpoint.
    stops = [line for line in out.splitlines() if "stopping training at step" in line]
    assert len(stops) == 2, out[-6000:]
    steps = {line.split("stopping training at step ")[1].split()[0].rstrip(";") for line in stops}
    assert len(steps) == 1, stops
    result = job_result(out)
    stop_step = int(steps.pop())
    assert result["global_step"] == stop_step < max_steps
    ckpt = work / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == stop_step
    # The scores reached the CSV logger: rank 1 about a third of rank 0.
    with (work / "logs" / "version_0" / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("straggler/num_stragglers")]
    assert rows, "no straggler metrics in metrics.csv"
    last = rows[-1]
    assert float(last["straggler/num_stragglers"]) == 1.0
    assert float(last["straggler/training_step_relative_perf_rank0"]) == pytest.approx(1.0)
    assert 0.15 < float(last["straggler/training_step_relative_perf_rank1"]) < 0.6
