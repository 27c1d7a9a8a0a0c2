"""Run a ckpt_worker.py scenario as a real 2-rank gloo job; kill every process by pid after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from zygote_client import RANK_GROUPS, ForkedJob, start_python

WORKER = Path(__file__).resolve().with_name("ckpt_worker.py")
RANK_GROUP = Path(__file__).resolve().with_name("rank_group.py")
RANKS_DEADLINE_S = 150
TIMEOUT_S = 180


def run_scenario(
    scenario: str,
    tmp: Path,
    *,
    world: int = 2,
    env: dict[str, str] | None = None,
    tmpfs_mb: int | None = None,
) -> tuple[dict[int, dict[str, Any]], str]:
    """Run ``scenario``; return each rank's findings and all ranks' logs (asserts success)."""
    root, out = tmp / "ckpt", tmp / "out"
    root.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    argv = [str(RANK_GROUP), str(world), str(out), str(RANKS_DEADLINE_S), "0"]
    argv += [str(WORKER), str(root), scenario, str(out)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc: subprocess.Popen[bytes] | ForkedJob
    if tmpfs_mb is None:
        proc = start_python(RANK_GROUPS, argv, full_env, subprocess.PIPE)
    else:
        # One private mount namespace for every rank: the tmpfs disappears with the job.
        script = f'mount -t tmpfs -o size={tmpfs_mb}m tmpfs "$0" && exec "$@"'
        proc = subprocess.Popen(
            ["unshare", "--mount", "sh", "-c", script, str(root), sys.executable, *argv],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        head, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # writers or ranks left in the session
    logs = head.decode(errors="replace") + "".join(
        f"\n--- rank {r}\n" + (out / f"rank{r}.log").read_text(errors="replace")
        for r in range(world)
        if (out / f"rank{r}.log").exists()
    )
    assert proc.returncode == 0, f"scenario {scenario} failed ({proc.returncode}):\n{logs[-6000:]}"
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(world)}
    return results, logs


def can_mount_tmpfs(tmp: Path) -> bool:
    """True when this user may mount a tmpfs in a private mount namespace."""
    target = tmp / "probe"
    target.mkdir(exist_ok=True)
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs -o size=1m tmpfs "{target}"'],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return probe.returncode == 0
