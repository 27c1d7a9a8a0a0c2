"""In-process restart over NCCL on the GPU (skipped cleanly without one).

One rank per GPU (NCCL refuses two ranks on one device), so on a one-GPU machine this is a
job of one rank: it still checks what only a GPU can, that the wrapper aborts a live NCCL
communicator through torch's process-group abort, destroys the group and forms a new one in
the same process, with the model's CUDA state kept in memory, after an exception and after a
GIL-released hang. With several GPUs the same test runs one rank on each.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from inprocess_harness import FAULT_STEP, Run, Torchrun, assert_resumed_like_unbroken

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(GPUS == 0, reason="needs an NVIDIA GPU"),
]


@pytest.fixture
def nccl(tmp_path: Path) -> Iterator[Torchrun]:
    runner = Torchrun(tmp_path, nproc=GPUS)
    yield runner
    runner.kill()


@pytest.fixture
def nccl_unbroken(nccl: Torchrun) -> Run:
    run = nccl.run("--backend", "nccl", name="unbroken")
    assert run.returncode == 0, run.output[-6000:]
    return run


def test_an_exception_aborts_the_nccl_group_and_training_resumes_in_process(
    nccl: Torchrun, nccl_unbroken: Run
) -> None:
    last = GPUS - 1
    run = nccl.run("--backend", "nccl", "--log-info", "--raise", f"{last}@{FAULT_STEP}")
    assert_resumed_like_unbroken(run, nccl_unbroken, iteration=1, nproc=GPUS)
    assert "aborted process groups (nccl)" in run.output, run.output[-6000:]
    assert "NCCL abort failed" not in run.output


def test_a_gil_released_hang_aborts_the_nccl_group_and_training_resumes(
    nccl: Torchrun, nccl_unbroken: Run
) -> None:
    run = nccl.run(
        "--backend",
        "nccl",
        "--log-info",
        "--hang",
        f"0@{FAULT_STEP}",
        "--soft",
        "4",
        "--hard",
        "40",
    )
    assert_resumed_like_unbroken(run, nccl_unbroken, iteration=1, nproc=GPUS)
    assert "soft_timeout 4 s" in run.output
    assert "aborted process groups (nccl)" in run.output, run.output[-6000:]
