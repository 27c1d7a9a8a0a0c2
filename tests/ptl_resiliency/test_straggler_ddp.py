"""Two DDP ranks over gloo, rank 1 three times slower: flagged, logged to CSV, both ranks stop.

The step's duration is injected: the straggler detector of each rank reads a clock that only
the training step moves (20 ms on rank 0, 60 ms on rank 1), so the scores are exact and the
report lands at a known step, however busy the machine is.
"""

from __future__ import annotations

import csv
from pathlib import Path

import lightning_flavour
import pytest
import torch
from ptl_harness import JOB, Jobs, job_result

STEP_S = 0.02
SLOW_FACTOR = 3
INTERVAL_S = 1.0


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
            "--straggler-interval", str(INTERVAL_S),
            "--slow-rank", "1",
            "--slow-factor", str(SLOW_FACTOR),
            "--step-time", str(STEP_S),
            "--manual-clock",
            "--max-steps", str(max_steps),
            "--ckpt-every", "1000",
            "--stop-if-detected",
        ],
        timeout=180,
    )  # fmt: skip
    assert code == 0, out[-6000:]
    # Rank 0 names rank 1 (and only rank 1) in its straggler warning, with its exact score.
    flagged = [
        line.split("straggler detected: ")[1]
        for line in out.splitlines()
        if "straggler detected" in line
    ]
    assert flagged, out[-6000:]
    assert all(" on rank 1 " in text and "rank 0" not in text for text in flagged), flagged
    assert any(text.endswith(": 0.33") for text in flagged), flagged
    # Rank 0's clock decides: the first report comes after INTERVAL_S / STEP_S = 50 steps, and
    # both ranks stop there, after a checkpoint.
    stops = [line for line in out.splitlines() if "stopping training at step" in line]
    assert len(stops) == 2, out[-6000:]
    steps = {line.split("stopping training at step ")[1].split()[0].rstrip(";") for line in stops}
    assert steps == {"50"}, stops
    result = job_result(out)
    assert result["lightning"] == lightning_flavour.NAME  # the Trainer this lane selected
    assert result["global_step"] == 50
    ckpt = work / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 50
    # The scores reached the CSV logger: rank 1 exactly a third of rank 0.
    with (work / "logs" / "version_0" / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("straggler/num_stragglers")]
    assert len(rows) == 1, rows
    (row,) = rows
    assert float(row["straggler/num_stragglers"]) == 1.0
    assert float(row["straggler/training_step_relative_perf_rank0"]) == pytest.approx(1.0)
    assert float(row["straggler/training_step_relative_perf_rank1"]) == pytest.approx(
        1 / SLOW_FACTOR
    )
    # Neither rank slowed down against its own past.
    assert float(row["straggler/training_step_individual_perf_min"]) == pytest.approx(1.0)
