"""The JSON collectives and make_plan's plan exchange on a real 2-rank gloo job."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from zygote_client import RANK_GROUPS, start_python

pytest.importorskip("torch")

WORKER = Path(__file__).resolve().with_name("json_collectives_worker.py")
RANK_GROUP = Path(__file__).resolve().with_name("rank_group.py")
WORLD = 2

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Each rank's findings, from one job that runs every scenario (one start-up, not six)."""
    out = tmp_path_factory.mktemp("json_collectives")
    argv = [str(RANK_GROUP), str(WORLD), str(out), "150", "0", str(WORKER), str(out)]
    proc = start_python(RANK_GROUPS, argv, dict(os.environ), subprocess.PIPE)
    try:
        head, _ = proc.communicate(timeout=180)
    finally:  # the group's session: rank_group, the ranks and anything they started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    logs = "".join(
        (out / f"rank{r}.log").read_text(errors="replace")
        for r in range(WORLD)
        if (out / f"rank{r}.log").exists()
    )
    assert proc.returncode == 0, head.decode(errors="replace") + logs[-6000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}


def _value(rank: int) -> dict[str, Any]:
    return {"rank": rank, "text": "é✓" * (50 * rank + 1), "list": [1, 2.5, None, True, "x"]}


def test_all_gather_gather_and_scatter_deliver_every_value(results: dict[int, dict]) -> None:
    everyone = [_value(r) for r in range(WORLD)]
    for rank, found in results.items():
        c = found["collectives"]
        assert c["all_gather"] == everyone
        assert c["gather_to_0"] == (everyone if rank == 0 else None)
        assert c["gather_to_1"] == (everyone if rank == 1 else None)
        for src in range(WORLD):
            assert c[f"scatter_from_{src}"] == {"to": rank, "from": src, "pad": "z" * 100 * rank}


def test_a_value_that_is_not_json_fails_on_every_rank_and_nothing_hangs(
    results: dict[int, dict],
) -> None:
    for rank, found in results.items():
        failures = found["collectives"]["failures"]
        assert all(failures.values()), failures  # every rank raised, not only the bad one
        bad_gather = failures["gather_bad_on_1"]
        assert ("this rank's value" if rank == 1 else "group rank(s) [1]") in bad_gather
        assert ("this rank's value" if rank == 0 else "group rank(s) [0]") in failures[
            "all_gather_bad_on_0"
        ]
        expected = "set is not JSON serializable" if rank == 0 else "group rank 0 could not"
        assert expected in failures["scatter_bad_value"]
        expected = "1 values for a group of 2 ranks" if rank == 1 else "group rank 1 could not"
        assert expected in failures["scatter_too_few"]
        assert found["collectives"]["after_failures"] == [0, 1]


def test_make_plan_gives_each_rank_what_dcps_own_planning_gives(results: dict[int, dict]) -> None:
    for rank, found in results.items():
        m = found["make_plan"]
        assert m["decision"] == {"nonce": 7}
        assert m["prefix"] == f"__{rank}_"
        assert m["same_as_dcp"] is True
        assert m["metadata_same_as_dcp"] is (True if rank == 0 else None)
        assert m["cache_hit"] is True


def test_a_planning_failure_on_one_rank_is_an_error_on_every_rank(
    results: dict[int, dict],
) -> None:
    for found in results.values():
        m = found["make_plan"]
        no_plan, decision = m["setup_fails_on_1"]
        assert no_plan and "rank 1: planning failed" in decision["error"], decision
        assert "duplicated flatten key a.b" in decision["error"]
        no_plan, decision = m["decide_fails"]
        assert no_plan and "rank 0: could not prepare the step: OSError" in decision["error"]
        no_plan, decision = m["decide_not_json"]
        assert no_plan and "planning failed: scatter_json" in decision["error"]
        assert m["decide_error"] == [True, {"error": "no"}]
