"""Scripts written the way NVRx's in-process examples are written run on ours, import changed.

``jobs/nvrx_style.py`` follows the shape of NVRx's ``basic_example.py`` (the whole ``main()``
wrapped, a TCPStore of the application's own at ``MASTER_PORT + 1`` made again in every call,
the Wrapper's at ``MASTER_PORT + 2`` through ``store_kwargs``, ``CudaHealthCheck`` on a machine
with no GPU, a ``torch.save`` checkpoint inside ``call_wrapper.atomic()``) and of
``optimal_example.py`` (store, model and optimizer made once, each call's group on a
``PrefixStore`` named by ``call_wrapper.iteration``). 4 gloo ranks under plain torchrun, as those
examples are run; rank 2 raises at iteration 30, the newest checkpoint is iteration 19's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inprocess_harness import NPROC, PREIMPORTED_FLAGS, FtLauncher, Run, Torchrun

JOB = Path(__file__).parent / "jobs" / "nvrx_style.py"
FAULT_RANK, FAULT_AT, RESUME_AT = 2, 30, 19  # --chkpt-interval 20: saved at iteration 19

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("nvrx_style")]


def _run(tmp: Path, *args: str, launcher: type[Torchrun] = Torchrun) -> Run:
    flags = PREIMPORTED_FLAGS if launcher is FtLauncher else ()
    runner = launcher(tmp, job=JOB, flags=flags)
    (tmp / "ckpt").mkdir()
    try:
        return runner.run(*args, "--path", str(tmp / "ckpt"), "--chkpt-interval", "20")
    finally:
        runner.kill()


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    # forked from ft-launcher's pre-imported server: the reference's launcher is not the subject
    run = _run(tmp_path_factory.mktemp("unbroken"), "--mode", "basic", launcher=FtLauncher)
    assert run.returncode == 0, run.output[-6000:]
    finals = [r["params"] for r in run.records if r["event"] == "done"]
    assert len(finals) == NPROC and all(f == finals[0] for f in finals)
    return finals[0]


@pytest.mark.parametrize("mode", ["basic", "optimal"])
def test_a_raised_fault_restarts_every_rank_in_process_from_the_checkpoint(
    tmp_path: Path, unbroken: list[float], mode: str
) -> None:
    run = _run(tmp_path, "--mode", mode, "--fault", f"{FAULT_RANK}@{FAULT_AT}")
    assert run.returncode == 0, run.output[-8000:]
    assert f"example fault at iteration={FAULT_AT} from rank={FAULT_RANK}" in run.output
    first = {s["rank"]: s for s in run.starts(0)}
    again = {s["rank"]: s for s in run.starts(1)}
    assert sorted(first) == sorted(again) == list(range(NPROC)), run.output[-6000:]
    assert not run.starts(2), "one fault is one restart"
    for rank in range(NPROC):
        assert again[rank]["pid"] == first[rank]["pid"], f"rank {rank} was respawned"
        assert (first[rank]["step"], again[rank]["step"]) == (0, RESUME_AT)
    finals = [r["params"] for r in run.records if r["event"] == "done"]
    assert len(finals) == NPROC
    assert all(f == finals[0] for f in finals), "the ranks ended with different parameters"
    # within float32 rounding: a new DDP's first all-reduce uses its initial bucket layout
    assert finals[0] == pytest.approx(unbroken, rel=1e-5, abs=1e-6)


def _nested_lines(run: Run) -> list[str]:
    """The nested restarter's states, in order, as rank 0 logged them (the only rank that does)."""
    lines = [line for line in run.output.splitlines() if "[NestedRestarter]" in line]
    assert all(line.startswith("rank 0 |") for line in lines), lines
    return [line.split("name=[InProcess] ", 1)[1] for line in lines]


def test_the_nested_restarter_logs_each_restart_and_the_completion(tmp_path: Path) -> None:
    # NVRx's advanced_example.py --nested-restarter: initialize, abort, completion, terminate
    run = _run(
        tmp_path,
        *("--mode", "optimal", "--nested-restarter", "--fault", f"{FAULT_RANK}@{FAULT_AT}"),
        launcher=FtLauncher,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert _nested_lines(run) == [
        "state=initialize",
        "state=handling stage=starting",
        "state=handling stage=completed",
        "state=finalized",
    ], run.output[-6000:]


def test_a_fault_that_repeats_ends_the_job_through_the_terminate_callback(tmp_path: Path) -> None:
    run = _run(
        tmp_path,
        *("--mode", "optimal", "--nested-restarter", "--fault-every-call"),
        *("--fault", f"{FAULT_RANK}@5"),
        launcher=FtLauncher,
    )
    assert run.returncode != 0, run.output[-8000:]
    assert "RepeatedFaultError: the same fault ended 3 attempts in a row" in run.output, run.output[
        -8000:
    ]
    states = _nested_lines(run)
    assert states[-1] == "state=aborted" and "state=finalized" not in states, states
    # torch's excepthook prefixes a traceback's lines once, with the current rank: not once per
    # init_process_group of the three attempts ("[rank2]: [rank2]: [rank2]: ...")
    tracebacks = [line for line in run.output.splitlines() if "Traceback" in line]
    assert tracebacks and all(line.count("[rank") <= 1 for line in tracebacks), tracebacks
