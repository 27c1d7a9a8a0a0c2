"""A rank hangs with the GIL released: the monitors see it and every rank restarts in-process.

The hung rank sleeps in libc (``ctypes.CDLL(None).sleep``), so Python threads keep running
while its peers wait in DDP's all-reduce. After ``soft_timeout`` without progress every rank
aborts (the gloo sockets are shut down) and the hung rank's main thread is interrupted by the
restart signal. A hang that masks that signal cannot be aborted in-process: it is terminated
at ``hard_timeout``, with its stacks dumped, and plain torchrun then ends the job (respawning
it alone is the ft-launcher mode, a later step of issue 32).
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
