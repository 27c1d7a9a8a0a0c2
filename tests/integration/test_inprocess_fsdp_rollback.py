"""Sharded state rolls back in-process to the newest local-tier step every rank holds.

2 gloo ranks of tests/inprocess/jobs/fsdp_rollback.py (FSDP2 ``fully_shard`` on CPU, SGD with
momentum, a ``CheckpointManager`` with a ``LocalTier`` saving every 3 steps) under
``inprocess.Wrapper``, every rank forked from ft-launcher's pre-imported server (the cheapest
start of the ranks; the launcher is not the subject, and the in-process tests run the Wrapper
under plain torchrun too). Rank 1 raises at the start of step 7, after the local
saves of steps 3 and 6: both ranks resume in the same processes at step 6 with their shards
equal to an unbroken run's at step 6, and train to the end like it; the goodput ledger
records the rollback (step 6, 1 step lost: step 7 is trained again) and ``resiliency-goodput
report`` counts the restart. When rank 0 lost its step 6 (a save that never landed), both take
step 3: the ranks never mix steps. When rank 1 hangs in libc with the GIL released (right
after the save of step 6 was started), the monitors abort the group and both ranks resume at
one agreed local step; the same on the issue's 4 ranks. When a rank is SIGKILLed under
``ft-launcher --ft-inprocess-respawn`` (2 and 4 ranks), it is respawned alone, the new process
joins, and every rank (the survivors in their own processes) rolls back to one agreed step. Every
iteration's manager is closed and leaves no writer process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("resiliency.checkpoint")
pytest.importorskip("resiliency.inprocess")
pytest.importorskip("torch.distributed.fsdp")

from resiliency.goodput import DIR_ENV, compute, read_ledger, validate_event
from resiliency.goodput.cli import main as report_main

sys.path.insert(0, str(Path(__file__).parents[1] / "inprocess"))
from inprocess_harness import FT_LAUNCHER_FLAGS, REPO, FtLauncher

JOB = REPO / "tests" / "inprocess" / "jobs" / "fsdp_rollback.py"
NPROC = 2


# Every rank forked from ft-launcher's server that pre-imported what the job imports: the
# cheapest start of the ranks for a test whose subject is not the launcher (issue 31).
PREIMPORTED = (
    *FT_LAUNCHER_FLAGS,
    "--ft-preimport",
    "torch,torch._dynamo,torch.distributed.fsdp,resiliency.inprocess,resiliency.checkpoint",
)
# ft-launcher's mode for a dead rank: respawned alone, forked from that server (the respawn
# must reach the Wrapper's store within heartbeat_timeout)
RESPAWN_ALONE = (*PREIMPORTED, "--ft-inprocess-respawn", "--max-restarts", "3")


def run_job(
    tmp: Path,
    *job_args: str,
    env: dict[str, str] | None = None,
    nproc: int = NPROC,
    ft_launcher: tuple[str, ...] = PREIMPORTED,
) -> tuple[int, str, list[dict]]:
    """One ft-launcher run of the job with these flags; its session is killed by pid if it
    outlives 300 s."""
    runner = FtLauncher(tmp, nproc, job=JOB, flags=ft_launcher)
    try:
        run = runner.run(*job_args, timeout=300, env=env)
    finally:
        runner.kill()
    assert_no_writer_left(run.records)
    return run.returncode, run.output, run.records


def assert_no_writer_left(records: list[dict]) -> None:
    """Every child process a rank had before closing a manager (its writer) is gone after
    the close and after the job; one still alive is killed (by pid) and fails the test."""
    pids = []
    for r in (r for r in records if r["event"] == "closed"):
        assert r["before"], f"no writer process before the close (nothing checked): {r}"
        assert not set(r["before"]) & set(r["after"]), f"a writer outlived its close: {r}"
        pids += r["before"]
    left = still_running(pids)
    assert not left, f"writer processes left behind after the job: {left}"


def shard_at(records: list[dict], rank: int, step: int) -> list[float]:
    """Rank ``rank``'s shard after ``step`` (the last record of it: the resumed run's)."""
    found = [r for r in records if r["event"] == "params" and r["rank"] == rank]
    return [r for r in found if r["step"] == step][-1]["params"]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict]]:
    code, output, records = run_job(tmp_path_factory.mktemp("fsdp-unbroken"))
    assert code == 0, output[-6000:]
    yield records


def assert_rolled_back(output: str, records: list[dict], unbroken: list[dict], step: int) -> None:
    first = {r["rank"]: r for r in records if r["event"] == "start" and r["iteration"] == 0}
    again = {r["rank"]: r for r in records if r["event"] == "start" and r["iteration"] == 1}
    assert sorted(again) == list(range(NPROC)), output[-6000:]
    for rank in range(NPROC):
        assert again[rank]["pid"] == first[rank]["pid"], f"rank {rank} is a new process"
        assert again[rank]["step"] == step, f"rank {rank} resumed at {again[rank]['step']}"
        assert again[rank]["params"] == shard_at(unbroken, rank, step), f"rank {rank}'s shard"
        # trained to the end like the unbroken run (float32 rounding after the resumed steps)
        end = shard_at(records, rank, 12)
        assert end == pytest.approx(shard_at(unbroken, rank, 12), rel=1e-5, abs=1e-6)
    # every iteration closed its manager, the failed one too
    closed = sorted((r["rank"], r["iteration"]) for r in records if r["event"] == "closed")
    assert closed == [(rank, it) for rank in range(NPROC) for it in (0, 1)], output[-6000:]


def ledger_events(ledger_dir: Path, event: str) -> list[dict]:
    lines = [
        json.loads(x)
        for p in sorted(ledger_dir.glob("*.jsonl"))
        for x in p.read_text().splitlines()
        if x
    ]
    return [x for x in lines if x["event"] == event]


@pytest.mark.slow
def test_every_rank_rolls_back_in_process_to_the_newest_local_step(
    tmp_path: Path, unbroken: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    ledger_dir = tmp_path / "ledger"
    code, output, records = run_job(tmp_path, "--raise", "1@7", env={DIR_ENV: str(ledger_dir)})
    assert code == 0, output[-6000:]
    assert "rank 1: iteration 0: the wrapped function raised RuntimeError" in output
    assert_rolled_back(output, records, unbroken, step=6)
    assert "rank 0: rollback: every rank resumes at step 6 (1 steps lost" in output

    # the ledger: the restart, and the rollback it led to with its iteration; 7 steps were
    # trained on both ranks before the fault, so one (step 7) is trained again
    [restart] = ledger_events(ledger_dir, "inprocess_restart")
    [rollback] = ledger_events(ledger_dir, "inprocess_rollback")
    assert validate_event(rollback) is None
    assert (restart["cause"], restart["ranks"]) == ("exception", [1])
    assert rollback["iteration"] == restart["iteration"] == 1
    assert (rollback["step"], rollback["lost_steps"]) == (6, 1)
    assert rollback["trained_steps"] == [7, 7]
    assert rollback["time"] >= restart["time"]
    # the report counts it as a restart of class inprocess_exception
    report = compute(read_ledger(sorted(ledger_dir.glob("*.jsonl"))))
    assert report.restarts == 1
    [row] = report.by_class
    assert (row.cls, row.failures) == ("inprocess_exception", 1)
    assert row.restart_s >= restart["duration_s"] * 0.999
    assert report_main(["report", str(ledger_dir)]) == 0
    out = capsys.readouterr().out
    assert any(x.split()[:2] == ["inprocess_exception", "1"] for x in out.splitlines()), out


@pytest.mark.slow
def test_a_rank_with_an_older_newest_step_makes_everyone_take_the_common_step(
    tmp_path: Path, unbroken: list[dict]
) -> None:
    code, output, records = run_job(tmp_path, "--raise", "1@7", "--stale", "0")
    assert code == 0, output[-6000:]
    assert_rolled_back(output, records, unbroken, step=3)
    assert "rank 0: rollback: every rank resumes at step 3 (4 steps lost" in output


@pytest.mark.slow
def test_a_gil_released_hang_is_aborted_and_every_rank_rolls_back(
    tmp_path: Path, unbroken: list[dict]
) -> None:
    """Rank 1 sleeps in libc at the start of step 7, right after the save of step 6 started
    (it may still be in flight on the group the monitors abort). Both ranks resume at one
    local step: 6 when that save landed on both, else 3; never one each."""
    ledger_dir = tmp_path / "ledger"
    code, output, records = run_job(
        tmp_path,
        "--hang",
        "1@7",
        "--soft",
        "4",
        "--hard",
        "60",
        env={DIR_ENV: str(ledger_dir)},
    )
    assert code == 0, output[-6000:]
    assert "no progress for" in output and "soft_timeout 4 s" in output, output[-6000:]
    assert "could not be aborted" not in output
    again = {r["rank"]: r["step"] for r in records if r["event"] == "start" and r["iteration"]}
    assert len(set(again.values())) == 1, f"the ranks resumed at different steps: {again}"
    [step] = set(again.values())
    assert step in (3, 6), again
    assert_rolled_back(output, records, unbroken, step=step)
    [restart] = ledger_events(ledger_dir, "inprocess_restart")
    [rollback] = ledger_events(ledger_dir, "inprocess_rollback")
    assert restart["cause"] == "hang"
    assert rollback["iteration"] == restart["iteration"] == 1
    # rank 1 hung with 7 steps trained; rank 0 could not finish step 8 without it
    assert rollback["trained_steps"] == [7, 7]
    assert (rollback["step"], rollback["lost_steps"]) == (step, 7 - step)
    [row] = compute(read_ledger(sorted(ledger_dir.glob("*.jsonl")))).by_class
    assert (row.cls, row.failures) == ("inprocess_hang", 1)
    # the stall (4 s) lets rank 0's recorder write step 7 before the restart: redoing it is
    # lost progress in the report
    assert row.lost_progress_s > 0


@pytest.mark.slow
def test_on_4_ranks_a_gil_released_hang_rolls_every_rank_back_to_one_step(tmp_path: Path) -> None:
    """The issue's 4 gloo ranks, rank 2 hung in libc once step 7 is trained. One torchrun: the
    reference is the same run before the fault (its ranks are the same processes, its data
    seeded by step and rank), not a 4-rank unbroken run. Each rank reloads exactly the shard
    it had after the agreed step, and training step 7 again gives the shard it gave before."""
    ledger_dir = tmp_path / "ledger"
    nproc = 4
    code, output, records = run_job(
        tmp_path,
        "--hang",
        "2@7",
        "--soft",
        "4",
        "--hard",
        "60",
        env={DIR_ENV: str(ledger_dir)},
        nproc=nproc,
    )
    assert code == 0, output[-6000:]
    # any rank's soft timeout may fire first (all stall); rank 2's log shows where it sat
    assert "no progress for" in output and "soft_timeout 4 s" in output, output[-6000:]
    culprit = r"rank 2: iteration 0: fault: .*this rank's main thread at \S+\.py:\d+ in hang\)"
    assert re.search(culprit, output), output[-6000:]
    starts = {(r["rank"], r["iteration"]): r for r in records if r["event"] == "start"}
    assert sorted(starts) == [(rank, it) for rank in range(nproc) for it in (0, 1)], output[-6000:]
    steps = {starts[rank, 1]["step"] for rank in range(nproc)}
    assert len(steps) == 1, f"the ranks resumed at different steps: {starts}"
    [step] = steps
    assert step in (3, 6)

    for rank in range(nproc):
        assert starts[rank, 1]["pid"] == starts[rank, 0]["pid"], f"rank {rank} is a new process"
        reloaded = starts[rank, 1]["params"]
        assert reloaded == shard_in(records, rank, 0, step), f"rank {rank}'s reloaded shard"
        # the same processes, data and reduction order: bit for bit
        again = shard_in(records, rank, 1, 7)
        assert again == shard_in(records, rank, 0, 7), f"rank {rank}'s step 7 trained again"
        assert shard_in(records, rank, 1, 12)  # trained to the end
    closed = sorted((r["rank"], r["iteration"]) for r in records if r["event"] == "closed")
    assert closed == [(rank, it) for rank in range(nproc) for it in (0, 1)], output[-6000:]
    [restart] = ledger_events(ledger_dir, "inprocess_restart")
    [rollback] = ledger_events(ledger_dir, "inprocess_rollback")
    assert restart["cause"] == "hang"
    assert rollback["iteration"] == restart["iteration"] == 1
    assert rollback["trained_steps"] == [7] * nproc
    assert (rollback["step"], rollback["lost_steps"]) == (step, 7 - step)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("nproc", "dead", "save_of_6", "agreed"),
    [(2, 1, "in flight", (3, 6)), (2, 1, "landed", (6,)), (4, 2, "landed", (6,))],
    ids=["2-ranks-save-in-flight", "2-ranks-save-landed", "4-ranks-save-landed"],
)
def test_a_sigkilled_rank_respawned_alone_rolls_back_with_the_survivors(
    tmp_path: Path, nproc: int, dead: int, save_of_6: str, agreed: tuple[int, ...]
) -> None:
    """Rank ``dead`` SIGKILLs itself once step 7 is trained (the job's own progress times it),
    the save of step 6 just started (its collective then fails on the survivors, or it may land
    first) or waited for until it landed. ft-launcher respawns it alone; the survivors keep
    their processes, the new process joins at iteration 1, and every rank reloads the newest
    local step all hold (6 when that save landed on all, else 3), each exactly the shard it
    saved there, and trains on."""
    ledger_dir = tmp_path / "ledger"
    kill = ("--kill", f"{dead}@7", *(("--kill-saved",) if save_of_6 == "landed" else ()))
    code, output, records = run_job(
        tmp_path, *kill, env={DIR_ENV: str(ledger_dir)}, nproc=nproc, ft_launcher=RESPAWN_ALONE
    )
    assert code == 0, output[-8000:]
    assert "respawned it alone as pid" in output and "(SIGKILL)" in output, output[-8000:]
    assert "restarting the worker group" not in output, output[-8000:]
    [killed] = [r for r in records if r["event"] == "killed"]
    assert (killed["rank"], killed["iteration"], killed["step"]) == (dead, 0, 7)
    assert killed["children"], "the killed rank had no writer process (nothing checked)"
    assert_gone(killed["children"])  # its writer died with it
    ranks = range(nproc)
    starts = {(r["rank"], r["iteration"]): r for r in records if r["event"] == "start"}
    assert sorted(starts) == [(rank, it) for rank in ranks for it in (0, 1)], output[-6000:]
    for rank in ranks:
        if rank != dead:
            assert starts[rank, 1]["pid"] == starts[rank, 0]["pid"], f"rank {rank} is new"
    assert starts[dead, 0]["pid"] == killed["pid"] != starts[dead, 1]["pid"], "not respawned"
    steps = {starts[rank, 1]["step"] for rank in ranks}
    assert len(steps) == 1, f"the ranks resumed at different steps: {starts}"
    [step] = steps
    assert step in agreed, step

    for rank in ranks:
        # the shard the rank saved at that step (its old process's, for the dead rank)
        reloaded = starts[rank, 1]["params"]
        assert reloaded == shard_in(records, rank, 0, step), f"rank {rank}'s reloaded shard"
        # same data, same reduction order: step 7 trained again gives the same shard
        again = shard_in(records, rank, 1, 7)
        assert again == shard_in(records, rank, 0, 7), f"rank {rank}'s step 7 trained again"
        assert shard_in(records, rank, 1, 12)  # trained to the end
    # the survivors closed both managers, the new process its own; the dead one could not
    closed = sorted((r["rank"], r["iteration"]) for r in records if r["event"] == "closed")
    expected = sorted({(rank, it) for rank in ranks for it in (0, 1)} - {(dead, 0)})
    assert closed == expected, output[-6000:]
    [rollback] = ledger_events(ledger_dir, "inprocess_rollback")
    assert validate_event(rollback) is None
    assert rollback["iteration"] == 1
    # the survivors trained 7 steps; the new process none before the restart (-1 in the ledger)
    assert rollback["trained_steps"] == [-1 if rank == dead else 7 for rank in ranks]
    assert (rollback["step"], rollback["lost_steps"]) == (step, 7 - step)
    restarts = ledger_events(ledger_dir, "inprocess_restart")
    assert [r["iteration"] for r in restarts] == [1], restarts
    assert f"rank 0: rollback: every rank resumes at step {step} ({7 - step} steps lost" in output


def shard_in(records: list[dict], rank: int, iteration: int, step: int) -> list[float]:
    """The shard ``rank`` recorded after training ``step`` in restart ``iteration``
    (``shard_at`` takes the newest record of a step, whatever its iteration)."""
    key = ("params", rank, iteration, step)
    [found] = [
        r["params"]
        for r in records
        if (r["event"], r["rank"], r["iteration"], r.get("step")) == key
    ]
    return found


def assert_gone(pids: list[int]) -> None:
    """Every pid has exited; one still alive is killed (by pid) and fails the test."""
    alive = still_running(pids)
    assert not alive, f"processes left behind: {alive}"


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a dead rank's writer is reaped by whoever
    adopted it, possibly never in a container whose first process reaps nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def still_running(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """The pids still running ``timeout_s`` from now (each is then killed, by pid).

    A writer ends by its parent-death signal or at its socket's EOF once its rank is gone,
    moments after the job's end, or up to seconds later on a loaded machine.
    """
    deadline = time.monotonic() + timeout_s
    while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive
