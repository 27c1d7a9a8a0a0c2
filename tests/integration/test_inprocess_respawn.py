"""``ft-launcher --ft-inprocess-respawn``: a SIGKILLed rank is respawned alone and healed.

4 gloo ranks of tests/inprocess/jobs/train.py (DDP, SGD with momentum, ``inprocess.Healer``)
under a real ft-launcher with its fork server (``--ft-preimport torch,torch._dynamo,...``: the
job's optimizer imports torch._dynamo, seconds a respawned process would spend importing).
Rank 2 kills itself with SIGKILL at the start of step 5. The launcher respawns it alone; the
three others keep their processes, abort in-process and wait at the restart barrier; the new
process joins as rank 2 and is healed from a peer; no step is lost and the job ends like an
unbroken run.

The same for a rank the Wrapper cannot abort in-process (rank 2 sleeps in libc with the restart
signal blocked, or catches the restart request and then sleeps in libc in its handler): its
monitor thread asks the launcher for a respawn and terminates it at ``hard_timeout``; the
launcher respawns it alone and it is healed like the SIGKILLed one. A SIGTERM from anyone else
is a stop request: the group restarts the ordinary way.

The two sides of the agreements (the rejoin file's variable, the unabortable file's directory and
name) are checked in test_contracts.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("resiliency.launcher")
pytest.importorskip("resiliency.inprocess")

sys.path.insert(0, str(Path(__file__).parents[1] / "inprocess"))
from inprocess_harness import (
    FAULT_STEP,
    FT_LAUNCHER_FLAGS,
    NPROC,
    PREIMPORTED_FLAGS,
    FtLauncher,
    Run,
    free_port_run,
    unbroken_params_at,
)

HEAL = ("--heal", "--momentum", "0.9")
# The Wrapper's soft and hard timeouts for the ranks that cannot be aborted: short, so the
# termination comes within seconds (and long before heartbeat_timeout, 20 s).
SHORT_TIMEOUTS = ("--soft", "4", "--hard", "12")
# Respawn alone, forked from the pre-imported server, as the documented mode runs it. The
# whole-group restarts use it too: a rank forked from it costs ~1 s of CPU, a new interpreter
# ~3 s (issue 31).
RESPAWN_PREIMPORTED = (
    "--ft-inprocess-respawn",
    "--ft-preimport",
    "torch,torch._dynamo,resiliency.inprocess",
    "--max-restarts",
    "3",
)


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The healing job with no fault, its ranks forked from ft-launcher's pre-imported server
    (which launcher started them does not change what they train): the reference."""
    runner = FtLauncher(tmp_path_factory.mktemp("unbroken-respawn"), flags=PREIMPORTED_FLAGS)
    try:
        run = runner.run(*HEAL)
        assert run.returncode == 0, run.output[-6000:]
        yield run
    finally:
        runner.kill()


def launch(tmp: Path, *job_args: str, launcher_args: tuple[str, ...] = ()) -> Run:
    """One ft-launcher job of 4 ranks; killed by pid (its session) if it outlives 300 s."""
    runner = FtLauncher(tmp, flags=(*FT_LAUNCHER_FLAGS, *launcher_args))
    try:
        return runner.run(*job_args, timeout=300, name="out")
    finally:
        runner.kill()


@pytest.mark.slow
def test_a_sigkilled_rank_is_respawned_alone_joins_and_is_healed_from_a_peer(
    tmp_path: Path, unbroken: Run
) -> None:
    run = launch(
        tmp_path,
        *HEAL,
        "--kill",
        f"2@{FAULT_STEP}",
        launcher_args=RESPAWN_PREIMPORTED,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert "respawned it alone as pid" in run.output and "(SIGKILL)" in run.output
    assert_respawned_alone_and_healed(run, unbroken)


@pytest.mark.slow
def test_a_rank_that_cannot_be_aborted_is_terminated_respawned_alone_and_healed(
    tmp_path: Path, unbroken: Run
) -> None:
    run = launch(
        tmp_path,
        *HEAL,
        "--hang-masked",
        f"2@{FAULT_STEP}",
        *SHORT_TIMEOUTS,
        launcher_args=RESPAWN_PREIMPORTED,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert "rank 2: could not be aborted in-process" in run.output, run.output[-8000:]
    assert "ft-launcher will respawn it alone" in run.output
    assert "was terminated by its Wrapper: rank 2 could not be aborted" in run.output
    assert "respawned it alone as pid" in run.output, run.output[-8000:]
    # the others kept it a member: nobody declared it gone
    assert "declared it gone" not in run.output and "not among the survivors" not in run.output
    assert_respawned_alone_and_healed(run, unbroken)


@pytest.mark.slow
def test_a_rank_holding_the_gil_is_ended_by_its_monitor_process_respawned_and_healed(
    tmp_path: Path, unbroken: Run
) -> None:
    # Rank 2 sleeps in libc with the GIL held: its monitor thread cannot run, only its monitor
    # process (NVRx's monitor_process_interval) can end it, at hard_timeout.
    run = launch(
        tmp_path,
        *HEAL,
        "--hang-gil",
        f"2@{FAULT_STEP}",
        *SHORT_TIMEOUTS,
        launcher_args=RESPAWN_PREIMPORTED,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert "[inprocess monitor_process] rank 2" in run.output, run.output[-8000:]
    assert "its main thread holds the GIL" in run.output
    assert "Timeout (0:00:11)!" in run.output  # faulthandler's stack dump, before the kill
    assert "respawned it alone as pid" in run.output, run.output[-8000:]
    assert "declared it gone" not in run.output and "not among the survivors" not in run.output
    assert_respawned_alone_and_healed(run, unbroken)


@pytest.mark.slow
def test_a_rank_stuck_in_its_except_after_the_restart_request_is_respawned_alone(
    tmp_path: Path, unbroken: Run
) -> None:
    """Rank 2 gets ``RankShouldRestart`` and then sleeps in libc in its own ``except``: its
    monitor terminates it at ``hard_timeout`` all the same, and it is respawned and healed."""
    run = launch(
        tmp_path,
        *HEAL,
        "--stuck-in-except",
        f"2@{FAULT_STEP}",
        *SHORT_TIMEOUTS,
        launcher_args=RESPAWN_PREIMPORTED,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert [r["step"] for r in run.of(2, "caught_restart")] == [FAULT_STEP], run.output[-8000:]
    assert (
        "rank 2: could not be aborted in-process: it got the restart request but did not come "
        "back to the wrapper; the main thread is still at"
    ) in run.output, run.output[-8000:]
    assert "in stuck_in_except" in run.output
    assert "was terminated by its Wrapper: rank 2 could not be aborted" in run.output
    assert "declared it gone" not in run.output and "not among the survivors" not in run.output
    assert_respawned_alone_and_healed(run, unbroken)


@pytest.mark.slow
def test_a_sigkilled_rank_0_is_respawned_alone_too(tmp_path: Path, unbroken: Run) -> None:
    """The launcher of node 0 hosts the Wrapper's store, so rank 0's death does not end it."""
    run = launch(tmp_path, *HEAL, "--kill", f"0@{FAULT_STEP}", launcher_args=RESPAWN_PREIMPORTED)
    assert run.returncode == 0, run.output[-8000:]
    assert "hosting the in-process restart store at" in run.output
    assert "rank 0 (local rank 0, pid" in run.output and "respawned it alone" in run.output
    assert_respawned_alone_and_healed(run, unbroken, dead=0)


@pytest.mark.slow
def test_the_rank_hosting_the_store_that_cannot_be_aborted_restarts_the_whole_group(
    tmp_path: Path,
) -> None:
    """With an explicit store port (``store_kwargs``) rank 0 hosts the Wrapper's store, which
    ends with it: no respawn alone is asked for."""
    run = launch(
        tmp_path,
        *HEAL,
        "--store-port",
        str(free_port_run()),
        "--hang-masked",
        f"0@{FAULT_STEP}",
        *SHORT_TIMEOUTS,
        launcher_args=RESPAWN_PREIMPORTED,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert "rank 0: could not be aborted in-process" in run.output, run.output[-8000:]
    assert "this rank hosts the in-process restart store, which ends with it" in run.output
    assert "respawned it alone" not in run.output, run.output[-8000:]
    assert "restarting the worker group" in run.output, run.output[-8000:]
    assert_new_processes_everywhere_and_done(run)


@pytest.mark.slow
def test_a_sigterm_from_outside_is_not_respawned_alone(tmp_path: Path) -> None:
    run = launch(
        tmp_path,
        *HEAL,
        "--sigterm",
        f"2@{FAULT_STEP}",
        launcher_args=RESPAWN_PREIMPORTED,
    )
    assert run.returncode == 0, run.output[-8000:]
    assert "respawned it alone" not in run.output, run.output[-8000:]
    assert "restarting the worker group" in run.output, run.output[-8000:]
    assert_new_processes_everywhere_and_done(run)


def assert_new_processes_everywhere_and_done(run: Run) -> None:
    """The second attempt is new processes on every rank, and it finishes."""
    pids: dict[int, set[int]] = {}
    for start in run.records:
        if start["event"] == "start":
            pids.setdefault(start["rank"], set()).add(start["pid"])
    assert sorted(pids) == list(range(NPROC)) and all(len(p) == 2 for p in pids.values()), pids
    assert len([r for r in run.records if r["event"] == "done"]) == NPROC


def assert_respawned_alone_and_healed(run: Run, unbroken: Run, dead: int = 2) -> None:
    """Rank ``dead`` is a new process, the others kept theirs, and everyone resumed at the
    fault's step with the unbroken run's parameters and ended like it."""
    first = {s["rank"]: s["pid"] for s in run.starts(0)}
    again = {s["rank"]: s for s in run.starts(1)}
    assert sorted(again) == list(range(NPROC)), run.output[-6000:]
    # the survivors kept their processes; the dead rank is a new one
    for rank in set(range(NPROC)) - {dead}:
        assert again[rank]["pid"] == first[rank], f"rank {rank} was restarted by the launcher"
    assert again[dead]["pid"] != first[dead]
    assert "restarting the worker group" not in run.output
    assert "joined the running job" in run.output
    # one step for every rank, no step lost: the survivors were at step 5 when rank 2 died
    assert {s["step"] for s in again.values()} == {FAULT_STEP}
    heals = {r["rank"]: r for r in run.records if r["event"] == "heal" and r["iteration"] == 1}
    assert heals[dead]["healed"] and heals[dead]["source"] in set(range(NPROC)) - {dead}
    assert heals[dead]["previous_step"] == 0  # a new process: its own initial state, healed
    assert all(h["lost_steps"] == 0 for h in heals.values())
    expected = unbroken_params_at(unbroken, FAULT_STEP)
    for rank, start in again.items():
        assert start["params"] == expected, f"rank {rank} differs at step {FAULT_STEP}"
    finals = [r["params"] for r in run.records if r["event"] == "done"]
    unbroken_finals = [r["params"] for r in unbroken.records if r["event"] == "done"]
    assert len(finals) == NPROC and all(f == finals[0] for f in finals)
    # equal within float32 rounding after the resumed step (as tests/inprocess/test_heal.py)
    assert finals[0] == pytest.approx(unbroken_finals[0], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_a_respawned_rank_that_does_not_join_in_time_falls_back_to_a_full_restart(
    tmp_path: Path,
) -> None:
    # Without --ft-preimport: the one test of a rank respawned alone as a new interpreter.
    run = launch(
        tmp_path,
        *HEAL,
        "--kill",
        f"2@{FAULT_STEP}",
        "--respawn-delay",
        "60",
        launcher_args=(
            "--ft-inprocess-respawn",
            "--ft-respawn-timeout",
            "3",
            "--max-restarts",
            "3",
        ),
    )
    assert run.returncode == 0, run.output[-8000:]
    assert "respawned it alone as pid" in run.output
    assert (
        "did not join the running job within 3 s (--ft-respawn-timeout); killing it and "
        "restarting the whole worker group" in run.output
    ), run.output[-6000:]
    assert "restarting the worker group" in run.output
    # the second attempt is new processes on every rank, and it finishes
    pids = {}
    for start in run.records:
        if start["event"] == "start":
            pids.setdefault(start["rank"], set()).add(start["pid"])
    assert all(len(p) == 2 for p in pids.values()), pids
    assert len([r for r in run.records if r["event"] == "done"]) == NPROC
