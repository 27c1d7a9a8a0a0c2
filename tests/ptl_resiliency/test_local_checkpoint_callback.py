"""LocalCheckpointCallback on a real 2-rank Lightning DDP Trainer (CPU, gloo): local every 2
steps with a replica on the other rank's "node", persistent every 5; resume after one node's
local directory is wiped comes from the replica at the newest local step."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from ptl_harness import Jobs

from resiliency.ptl import CheckpointCallbackConfigError, LocalCheckpointCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))

from s3_harness import BUCKET, filesystem, s3_server

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parent / "ptl_tiers_job.py"


def _fit(jobs: Jobs, work: Path, max_steps: int, *extra: str) -> dict:
    code, out = jobs.run(
        [str(JOB), "--work-dir", str(work), "--max-steps", str(max_steps), *extra], timeout=240
    )
    assert code == 0, out[-6000:]
    line = next(x for x in out.splitlines() if x.startswith("PTL_TIERS_RESULT "))
    return json.loads(line.removeprefix("PTL_TIERS_RESULT "))


def test_bad_interval_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointCallbackConfigError):
        LocalCheckpointCallback(tmp_path, local_ckpt_interval=0)


def test_resume_from_a_peer_replica_after_a_node_lost_its_local_dir(
    jobs: Jobs, tmp_path: Path
) -> None:
    # No final save: step 8 exists only on the local tier (its cadence), step 5 is persistent.
    first = _fit(jobs, tmp_path, 8, "--no-final-save")
    assert first["resumed_from"] is None and first["global_step"] == 8
    assert sorted(p.name for p in (tmp_path / "persistent").glob("step_*")) == ["step_000000005"]
    assert sorted(p.name for p in (tmp_path / "node0" / "step_000000008").iterdir()) == [
        "shard_0",
        "shard_1",
    ]
    shutil.rmtree(tmp_path / "node1")
    second = _fit(jobs, tmp_path, 10)
    assert second["resumed_from"] == 8  # the local step (via node 0's replica), not persistent 5
    assert second["global_step"] == 10
    # Step 10 is due on both tiers.
    assert sorted(p.name for p in (tmp_path / "persistent").glob("step_*")) == [
        "step_000000005",
        "step_000000010",
    ]


@pytest.mark.allow_leak("thread", "socket", reason="fsspec's process-wide event loop (s3fs)")
def test_resume_from_an_object_store_after_every_local_dir_is_lost(
    jobs: Jobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with s3_server(tmp_path) as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        url = f"s3://{BUCKET}/ptl"
        first = _fit(jobs, tmp_path, 8, "--persistent", url, "--no-final-save")
        assert first["resumed_from"] is None and first["global_step"] == 8
        committed = filesystem(env).glob(f"{BUCKET}/ptl/step_*/manifest.json")
        assert [p.split("/")[-2] for p in committed] == ["step_000000005"]
        shutil.rmtree(tmp_path / "node0")
        shutil.rmtree(tmp_path / "node1")
        second = _fit(jobs, tmp_path, 10, "--persistent", url)
        assert second["resumed_from"] == 5  # from the object store: no local copy is left
        assert second["global_step"] == 10
