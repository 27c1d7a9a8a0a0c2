"""A rank hangs with the GIL released: the monitors see it and every rank restarts in-process.

The hung rank sleeps in libc (``ctypes.CDLL(None).sleep``), so Python threads keep running
while its peers wait in DDP's all-reduce. After ``soft_timeout`` without progress every rank
aborts (the gloo sockets are shut down) and the hung rank's main thread is interrupted by the
restart signal. A hang that masks that signal cannot be aborted in-process: it is terminated
at ``hard_timeout``, with its stacks dumped, and plain torchrun then ends the job (respawning
it alone is the ft-launcher mode, a later step of issue 32). So is a main thread that got the
restart request and then blocks in its own ``except`` clause, never coming back to the wrapper.
"""

from __future__ import annotations

import re

import pytest
from inprocess_harness import FAULT_STEP, NPROC, Run, Torchrun, assert_resumed_like_unbroken


@pytest.mark.slow
def test_a_gil_released_hang_is_aborted_and_every_rank_restarts(
    torchrun: Torchrun, unbroken: Run
) -> None:
    run = torchrun.run("--hang", f"1@{FAULT_STEP}", "--soft", "4", "--hard", "40")
    assert_resumed_like_unbroken(run, unbroken, iteration=1)
    assert "no progress for" in run.output and "soft_timeout 4 s" in run.output
    # the hung rank's log names where its main thread sat: in the job's fault(), not in torch
    culprit = r"rank 1: iteration 0: fault: .*main thread at \S+train\.py:\d+ in fault"
    assert re.search(culprit, run.output), run.output[-6000:]
    assert "could not be aborted" not in run.output


@pytest.mark.slow
def test_a_hang_that_cannot_be_interrupted_is_terminated_with_its_stacks(
    torchrun: Torchrun,
) -> None:
    run = torchrun.run("--hang-masked", f"1@{FAULT_STEP}", "--soft", "4", "--hard", "12")
    assert run.returncode != 0
    assert "rank 1: could not be aborted in-process" in run.output, run.output[-6000:]
    assert "hard_timeout 12 s" in run.output
    assert "Current thread" in run.output or "Thread 0x" in run.output  # faulthandler's dump
    # the three other ranks did leave their collective and reached the restart barrier
    assert run.output.count("restarting:") + run.output.count("the wrapped function raised") >= (
        NPROC - 1
    )


@pytest.mark.slow
def test_a_main_thread_stuck_after_the_restart_request_is_terminated_at_hard_timeout(
    torchrun: Torchrun,
) -> None:
    """Rank 1 catches ``RankShouldRestart`` and sleeps in libc (GIL released) in its handler:
    the request was delivered, yet it never comes back to the wrapper. Its monitor terminates
    it ``hard_timeout - soft_timeout`` after the abort, naming where it sat; the others stop
    waiting for it at the restart barrier and torchrun ends the job with rank 1's SIGTERM."""
    run = torchrun.run("--stuck-in-except", f"1@{FAULT_STEP}", "--soft", "4", "--hard", "12")
    assert run.returncode != 0, run.output[-6000:]
    assert [r["step"] for r in run.of(1, "caught_restart")] == [FAULT_STEP], run.output[-6000:]
    stuck = (
        r"rank 1: could not be aborted in-process: it got the restart request but did not come "
        r"back to the wrapper; the main thread is still at \S+train\.py:\d+ in stuck_in_except "
        r"(\d+\.\d) s after the abort \(hard_timeout 12 s\)"
    )
    found = re.search(stuck, run.output)
    assert found, run.output[-6000:]
    assert float(found.group(1)) >= 12 - 4  # not before hard_timeout - soft_timeout
    assert "Current thread" in run.output or "Thread 0x" in run.output  # faulthandler's dump
    # the others reached the restart barrier, not waited there until barrier_timeout
    assert run.output.count("restarting:") + run.output.count("the wrapped function raised") >= (
        NPROC - 1
    )
    assert "neither arrived nor were reported gone" not in run.output, run.output[-6000:]
    # torchrun's error names the terminated rank's signal
    signalled = "Signal 15 (SIGTERM)" in run.output or "exitcode  : -15" in run.output
    assert signalled, run.output[-4000:]
