"""``inprocess.Rollback``: the step a job with sharded state reloaded, checked across ranks.

Two plain gloo processes each report a step; the FSDP job that uses it under the Wrapper
(ledger, hang) is tests/integration/test_inprocess_fsdp_rollback.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from inprocess_harness import REPO, free_port_run

from resiliency.inprocess import Rollback
from resiliency.inprocess.exception import ConfigError

JOB = REPO / "tests" / "inprocess" / "jobs" / "rollback_ranks.py"


class Pair:
    """Starts the two ranks; any still running at teardown is killed by pid."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def run(self, *ranks: tuple[int, int]) -> list[dict]:
        """Each rank's (step, trained) -> each rank's printed JSON, in rank order."""
        port = free_port_run()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for rank, (step, trained) in enumerate(ranks):
            args = [rank, len(ranks), port, step, trained]
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(JOB), *map(str, args)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
            )
        outputs = [proc.communicate(timeout=240)[0] for proc in self.procs]
        for proc, out in zip(self.procs, outputs, strict=True):
            assert proc.returncode == 0, out[-4000:]
        return [json.loads(out.strip().splitlines()[-1]) for out in outputs]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)


@pytest.fixture
def pair() -> Iterator[Pair]:
    ranks = Pair()
    yield ranks
    ranks.kill()


@pytest.mark.parametrize("step", [-1, 2.0, True, "6", None])
def test_a_step_that_is_not_an_integer_of_at_least_zero_is_refused(step: object) -> None:
    with pytest.raises(ConfigError, match=r"Rollback.resumed\(step=.*expected an integer >= 0"):
        Rollback().resumed(step)  # type: ignore[arg-type]


def test_trained_keeps_the_newest_step_of_this_process() -> None:
    rollback = Rollback()
    assert rollback.trained_step is None
    rollback.trained(7)
    assert rollback.trained_step == 7


@pytest.mark.slow
def test_ranks_that_reloaded_different_steps_stop_with_every_rank_s_step(pair: Pair) -> None:
    results = pair.run((6, 7), (3, 7))
    for result in results:
        assert result["error"] == "RollbackError", result
        assert "rank 0: step 6, rank 1: step 3" in result["message"]
        assert "resuming would mix steps" in result["message"]


@pytest.mark.slow
def test_one_agreed_step_gives_every_rank_the_steps_lost(pair: Pair) -> None:
    # rank 1 had trained one step further before the fault (rank 0 had trained none)
    results = pair.run((6, -1), (6, 8))
    for result in results:
        assert result == {
            "step": 6,
            "trained": [None, 8],
            "lost": 2,
            "iteration": None,
            "trained_step": 6,
        }
