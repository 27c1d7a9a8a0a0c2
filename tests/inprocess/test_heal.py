"""Healing from the peers' memory (``resiliency.inprocess.Healer``): after an in-process
restart every rank resumes at one agreed step, the state a rank lost or half-updated comes from
a live peer over gloo, and every transfer is verified.

4 gloo ranks forked from ft-launcher's pre-imported server (the launcher is not the subject
here; test_exception_restart.py and test_hang_restart.py run under plain torchrun); SGD with
momentum, so the optimizer has state to heal too.
Faults inside healing come from ``RESILIENCY_INPROCESS_HEAL_FAULT`` (its one home is
``resiliency.inprocess._heal_faults``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess_harness import (
    FAULT_STEP,
    NPROC,
    PREIMPORTED_FLAGS,
    FtLauncher,
    Run,
    unbroken_params_at,
)

from resiliency.goodput import DIR_ENV, compute, read_ledger, validate_event
from resiliency.inprocess._heal_faults import HEAL_FAULT_ENV

HEAL = ("--heal", "--momentum", "0.9")


@pytest.fixture(scope="module")
def unbroken_momentum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The healing job with no fault: every heal is the no-transfer path."""
    runner = FtLauncher(tmp_path_factory.mktemp("unbroken-heal"), flags=PREIMPORTED_FLAGS)
    try:
        run = runner.run(*HEAL)
        assert run.returncode == 0, run.output[-6000:]
        assert all(not h["receivers"] for h in run.records if h["event"] == "heal")
        yield run
    finally:
        runner.kill()


def heals(run: Run, iteration: int) -> dict[int, dict]:
    return {
        r["rank"]: r for r in run.records if r["event"] == "heal" and r["iteration"] == iteration
    }


def assert_one_step_like_unbroken(run: Run, unbroken: Run, iteration: int) -> int:
    """Every rank started ``iteration`` in its own process at one step, with the unbroken
    run's parameters at that step, and finished like it. Returns the step."""
    assert run.returncode == 0, run.output[-8000:]
    starts = run.starts(iteration)
    assert sorted(s["rank"] for s in starts) == list(range(NPROC)), run.output[-6000:]
    first_pids = {s["rank"]: s["pid"] for s in run.starts(0)}
    assert all(s["pid"] == first_pids[s["rank"]] for s in starts), "respawned, not restarted"
    steps = {s["step"] for s in starts}
    assert len(steps) == 1, f"ranks resumed at different steps: {steps}"
    [step] = steps
    expected = unbroken_params_at(unbroken, step)
    for start in starts:
        assert start["params"] == expected, f"rank {start['rank']} differs at step {step}"
    finals = [r["params"] for r in run.records if r["event"] == "done"]
    unbroken_finals = [r["params"] for r in unbroken.records if r["event"] == "done"]
    assert len(finals) == NPROC
    assert all(f == finals[0] for f in finals), "the ranks diverged after the restart"
    # Bit for bit at the resumed step (above). After it the steps run in a new DDP (its
    # gradient bucket not yet rebuilt, so its layout may differ) and gloo's ring sum can add
    # an element's four terms in another order: measured 3e-8 after 7 steps with momentum,
    # on every rank alike. Equal within float32 rounding.
    assert finals[0] == pytest.approx(unbroken_finals[0], rel=1e-5, abs=1e-6)
    return step


@pytest.mark.slow
def test_a_rank_failing_inside_its_optimizer_step_is_healed_from_a_peer(
    ft_launcher: FtLauncher, unbroken_momentum: Run
) -> None:
    run = ft_launcher.run(*HEAL, "--raise-mid-update", f"2@{FAULT_STEP}")
    step = assert_one_step_like_unbroken(run, unbroken_momentum, iteration=1)
    # the others finished the step rank 2 failed in (their optimizer step is atomic): nothing
    # of it is lost
    assert step == FAULT_STEP + 1, run.output[-6000:]
    healed = heals(run, 1)
    assert healed[2]["healed"] and healed[2]["previous_step"] == FAULT_STEP
    assert healed[2]["source"] in {0, 1, 3} and healed[2]["nbytes"] > 0
    assert all(h["receivers"] == [2] and h["lost_steps"] == 0 for h in healed.values())
    assert not any(healed[r]["healed"] for r in (0, 1, 3))
    assert f"rank 2: healed to step {step} from rank {healed[2]['source']}" in run.output
    assert "verified; it was at step 5" in run.output
    # per-rank values are restored on every rank, at the agreed step
    assert sorted(
        r["rank"] for r in run.records if r["event"] == "per_rank" and r["step"] == step
    ) == list(range(NPROC))


@pytest.mark.slow
def test_two_ranks_failing_inside_their_optimizer_step_are_healed_from_different_peers(
    ft_launcher: FtLauncher, unbroken_momentum: Run
) -> None:
    run = ft_launcher.run(
        *HEAL, "--raise-mid-update", f"1@{FAULT_STEP}", "--raise-mid-update", f"3@{FAULT_STEP}"
    )
    step = assert_one_step_like_unbroken(run, unbroken_momentum, iteration=1)
    assert step == FAULT_STEP + 1, run.output[-6000:]
    assert not run.starts(2), "two simultaneous faults are one restart and one heal"
    healed = heals(run, 1)
    assert all(h["receivers"] == [1, 3] for h in healed.values())
    # the receivers are spread over the sources
    assert (healed[1]["source"], healed[3]["source"]) == (0, 2)


@pytest.mark.slow
def test_a_corrupt_transfer_is_detected_and_fetched_again_from_another_peer(
    ft_launcher: FtLauncher, unbroken_momentum: Run, tmp_path: Path
) -> None:
    ledger_dir = tmp_path / "ledger"
    run = ft_launcher.run(
        *HEAL,
        "--raise-mid-update",
        f"2@{FAULT_STEP}",
        env={HEAL_FAULT_ENV: "corrupt@0", DIR_ENV: str(ledger_dir)},
    )
    step = assert_one_step_like_unbroken(run, unbroken_momentum, iteration=1)
    assert f"rank 2: the state at step {step} from rank 0 failed verification" in run.output, (
        run.output[-6000:]
    )
    healed = heals(run, 1)
    assert healed[2]["source"] == 1
    assert all(h["failed_copies"] == 1 for h in healed.values())
    assert f"rank 2: healed to step {step} from rank 1" in run.output
    # the ledger: one heal after the restart, with the step resumed from and the steps lost
    lines = [json.loads(x) for p in ledger_dir.glob("*.jsonl") for x in p.read_text().splitlines()]
    [event] = [x for x in lines if x["event"] == "inprocess_heal"]
    assert validate_event(event) is None
    assert (event["step"], event["lost_steps"], event["iteration"]) == (step, 0, 1)
    assert (event["healed_ranks"], event["failed_copies"]) == ([2], 1)
    assert event["bytes"] == healed[2]["nbytes"] > 0
    assert 1 not in event["healed_ranks"] and 1 in event["source_ranks"]
    assert compute(read_ledger(sorted(ledger_dir.glob("*.jsonl")))).restarts == 1


@pytest.mark.slow
def test_every_copy_corrupt_stops_the_job_with_an_error_naming_rank_and_step(
    ft_launcher: FtLauncher,
) -> None:
    run = ft_launcher.run(
        *HEAL,
        "--raise-mid-update",
        f"2@{FAULT_STEP}",
        env={HEAL_FAULT_ENV: "corrupt@0,corrupt@1,corrupt@3"},
    )
    assert run.returncode != 0
    assert (
        f"HealError: rank 2 could not be healed to step {FAULT_STEP + 1}: the state sent by "
        "every source (ranks [0, 1, 3]) failed verification"
    ) in run.output, run.output[-6000:]
    # nobody trained on: no rank started iteration 1 at any step
    assert not run.starts(1)


@pytest.mark.slow
def test_a_fault_during_healing_ends_at_one_agreed_step(
    ft_launcher: FtLauncher, unbroken_momentum: Run
) -> None:
    # rank 2 fails at the start of step 5 and comes back with a lost state (as a new process
    # would); rank 0, its first source, fails while sending it: one more restart, one more heal
    run = ft_launcher.run(
        *HEAL, "--raise", f"2@{FAULT_STEP}", "--forget", "2", env={HEAL_FAULT_ENV: "raise@0"}
    )
    assert not run.starts(1), "nobody trains in the iteration whose healing failed"
    step = assert_one_step_like_unbroken(run, unbroken_momentum, iteration=2)
    assert step == FAULT_STEP
    assert "injected fault on rank 0 while sending its state" in run.output
    healed = heals(run, 2)
    assert healed[2]["healed"] and healed[2]["previous_step"] is None
    assert healed[2]["source"] == 0
