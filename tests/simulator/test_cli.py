"""resiliency-simulate end to end on a stand-in job: plan, injection, ledger, table, clean-up."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

FAKE_JOB = Path(__file__).with_name("_fake_job.py")


def _pids_of(job_id: str) -> list[int]:
    mine = f"RESILIENCY_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _simulate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "resiliency.simulator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )


def test_kill_is_injected_recorded_tabled_and_everything_is_stopped(tmp_path: Path) -> None:
    job = f"cli-{uuid.uuid4().hex[:8]}"
    ledger = tmp_path / "ledger"
    out = _simulate(
        tmp_path,
        *("--seed", "5", "--faults", "kill", "--mtbf", "1", "--keep-alive", "3"),
        *("--count", "1", "--duration", "8", "--goodput-dir", str(ledger), "--job-id", job),
        *("--", sys.executable, str(FAKE_JOB), str(tmp_path), "2"),
    )
    assert out.returncode == 0, out.stderr
    assert "plan (seed 5, 1 fault(s))" in out.stderr
    header, row = out.stdout.splitlines()[:2]
    assert header.split()[:3] == ["#", "fault", "victim"]
    assert row.split()[1:3] == ["kill", "rank"], out.stdout
    events = [
        json.loads(line) for f in ledger.glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    (injected,) = [e for e in events if e["event"] == "fault_injected"]
    assert injected["kind"] == "kill" and injected["victim"].startswith("rank ")
    assert injected["job"] == job
    assert not _pids_of(job), "processes of the job were left running"


def test_usage_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    no_command = _simulate(tmp_path, "--seed", "1", "--count", "1")
    assert no_command.returncode == 2 and "launcher command after --" in no_command.stderr
    typo = _simulate(tmp_path, "--seed", "1", "--count", "1", "--faults", "kil", "--", "true")
    assert typo.returncode == 2 and "unknown fault kind" in typo.stderr
    unbounded = _simulate(tmp_path, "--seed", "1", "--", "true")
    assert unbounded.returncode == 2 and "--duration or --count" in unbounded.stderr
