"""A rank raises: every rank trains again in the same processes, from the same step, in step.

4 gloo ranks; the wrapper's store is a real TCPStore hosted by rank 0. Under plain torchrun
(``python -m torch.distributed.run``) where its behaviour is the subject: the first fault and a
rank leaving the job; the other cases fork their ranks from ft-launcher's pre-imported server
(9 s of CPU per job instead of 15 s for four fresh interpreters; the Wrapper does the same under
either launcher).
"""

from __future__ import annotations

import pytest
from inprocess_harness import (
    FAULT_STEP,
    NPROC,
    FtLauncher,
    Run,
    Torchrun,
    assert_resumed_like_unbroken,
)


@pytest.mark.slow
def test_a_rank_raises_and_every_rank_resumes_at_the_same_step(
    torchrun: Torchrun, unbroken: Run
) -> None:
    run = torchrun.run("--raise", f"2@{FAULT_STEP}")
    assert_resumed_like_unbroken(run, unbroken, iteration=1)
    assert "rank 2: iteration 0: the wrapped function raised RuntimeError: injected" in run.output
    # the others' failed collectives are the echo of rank 2's fault, not faults of their own
    assert "rank 0: iteration 0: the wrapped function raised" not in run.output
    assert "restart 0 -> 1" in run.output


@pytest.mark.slow
def test_two_ranks_raise_at_once(ft_launcher: FtLauncher, unbroken: Run) -> None:
    run = ft_launcher.run("--raise", f"1@{FAULT_STEP}", "--raise", f"3@{FAULT_STEP}")
    assert_resumed_like_unbroken(run, unbroken, iteration=1)
    assert not run.starts(2), "two simultaneous faults are one restart"
    for rank in (1, 3):
        assert f"rank {rank}: iteration 0: the wrapped function raised RuntimeError" in run.output


@pytest.mark.slow
def test_a_fault_during_the_restart_gives_one_more_agreed_iteration(
    ft_launcher: FtLauncher, unbroken: Run
) -> None:
    run = ft_launcher.run("--raise", f"1@{FAULT_STEP}", "--init-raise", "2@1")
    assert_resumed_like_unbroken(run, unbroken, iteration=2)
    # iteration 1 never called the function on any rank: all agreed to go on to iteration 2
    assert not run.starts(1)
    assert "injected initialize fault at iteration 1" in run.output


@pytest.mark.slow
def test_a_rank_that_fails_its_health_check_leaves_with_a_clear_error(torchrun: Torchrun) -> None:
    run = torchrun.run("--raise", f"1@{FAULT_STEP}", "--unhealthy", "3")
    # plain torchrun ends the job when a worker exits with an error
    assert run.returncode != 0
    assert (
        "rank 3: iteration 0: leaving the job: HealthCheckError: rank 3: health check failed "
        "after iteration 0: RuntimeError: injected: rank 3's device is broken"
    ) in run.output, run.output[-6000:]
    # rank 3 never trains again; whoever did before torchrun stopped them resumed at one step
    assert 3 not in {s["rank"] for s in run.starts(1)}
    assert {s["step"] for s in run.starts(1)} <= {FAULT_STEP}


@pytest.mark.slow
def test_the_failed_calls_model_and_process_group_are_freed_before_the_next_call(
    ft_launcher: FtLauncher, unbroken: Run
) -> None:
    run = ft_launcher.run("--raise", f"2@{FAULT_STEP}", "--check-freed")
    assert_resumed_like_unbroken(run, unbroken, iteration=1)
    freed = [r for r in run.records if r["event"] == "freed"]
    assert sorted(r["rank"] for r in freed) == list(range(NPROC)), run.output[-6000:]
    # every rank: iteration 0's DistributedDataParallel and ProcessGroup are gone
    assert all(r["alive"] == [] for r in freed), freed
