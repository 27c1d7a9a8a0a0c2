"""The stop rule: a rank that fails the same way at the same step in every attempt is not
restarted forever (``Wrapper(max_repeated_faults=3)``, the default), while a fault that repeats
after progress, or a transient one, still restarts and the job finishes.

4 gloo ranks forked from ft-launcher's pre-imported server (the launcher is not the subject
here; test_exception_restart.py and test_hang_restart.py run under plain torchrun).
"""

from __future__ import annotations

import pytest
from inprocess_harness import FAULT_STEP, NPROC, FtLauncher

STOPPED = (
    "RepeatedFaultError: the same fault ended 3 attempts in a row on initial rank(s) [2] with "
    "no progress in between (iterations 0-2): ValueError: injected repeated fault on rank 2; "
    "not restarting it again (Wrapper(max_repeated_faults=3)"
)


@pytest.mark.slow
def test_a_deterministic_fault_stops_after_three_attempts_on_every_rank(
    ft_launcher: FtLauncher,
) -> None:
    run = ft_launcher.run("--value-error", f"2@{FAULT_STEP}", "--ping", timeout=300)
    assert run.returncode != 0
    # every rank stops with the error, after three attempts (two restarts), none hangs
    for rank in range(NPROC):
        assert f"rank {rank}: iteration 2: leaving the job: {STOPPED}" in run.output, run.output[
            -6000:
        ]
    assert {s["iteration"] for s in run.records if s["event"] == "start"} == {0, 1, 2}
    assert not run.starts(3)
    assert not [r for r in run.records if r["event"] == "done"]


@pytest.mark.slow
def test_the_same_fault_after_progress_restarts_and_the_job_finishes(
    ft_launcher: FtLauncher,
) -> None:
    # the same ValueError three times, but each attempt trained (and pinged) before it
    steps = f"{FAULT_STEP},{FAULT_STEP + 2},{FAULT_STEP + 4}"
    run = ft_launcher.run("--value-error", f"2@{steps}", "--ping", "--steps", "14")
    assert run.returncode == 0, run.output[-6000:]
    assert "RepeatedFaultError" not in run.output
    assert sorted(s["rank"] for s in run.starts(3)) == list(range(NPROC))
    assert len([r for r in run.records if r["event"] == "done"]) == NPROC


@pytest.mark.slow
def test_the_rule_can_be_turned_off(ft_launcher: FtLauncher) -> None:
    # two attempts at the same step with no limit, then the fault stops coming: it finishes
    run = ft_launcher.run(
        "--value-error", f"2@{FAULT_STEP},{FAULT_STEP},{FAULT_STEP}", "--max-repeated", "0"
    )
    assert run.returncode == 0, run.output[-6000:]
    assert "RepeatedFaultError" not in run.output
    assert sorted(s["rank"] for s in run.starts(3)) == list(range(NPROC))
