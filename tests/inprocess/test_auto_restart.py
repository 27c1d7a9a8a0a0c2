"""inprocess.auto_restart (NVRx's monitor_and_restart) with real forks, signals and exits."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from zygote_client import start_python

JOB = Path(__file__).with_name("jobs") / "auto_restart_job.py"
DEADLINE_S = 60.0
# Both files fork from one zygote (torch and resiliency.inprocess imported): in one xdist
# worker, so it starts once.
pytestmark = pytest.mark.xdist_group("inprocess_tools_zygote")


def test_a_failed_child_is_forked_again_until_one_exits_0(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    job = start_python(
        ("torch", "resiliency.inprocess"),
        [str(JOB), str(counter)],
        dict(os.environ),
        subprocess.PIPE,
        text=True,
    )
    try:
        assert job.wait(DEADLINE_S) == 0  # the supervisor ends with the child that succeeded
    finally:
        if job.poll() is None:
            job.kill()
        out = job.communicate(DEADLINE_S)[0]
    assert counter.read_text() == "3", out
    children = [int(pid) for pid in re.findall(r"Launched child (\d+)", out)]
    assert len(children) == 3 and job.pid not in children, out
    first, second, third = children
    assert out.startswith("Starting self-monitoring mode\n"), out
    for line in (
        f"Child {first} exited with signal 9",
        f"Child {second} exited with status 1",
        f"Child {third} exited with status 0",
        f"child run 3 (pid {third})",
    ):
        assert line in out, out
