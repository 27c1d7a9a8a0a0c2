"""inprocess.tools.inject_fault (NVRx's): each fault really happens to a real process, and
every rank draws the same ranks from the seed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from zygote_client import start_python

JOB = Path(__file__).with_name("jobs") / "inject_fault_job.py"
MODULES = ("torch", "resiliency.inprocess")
DEADLINE_S = 60.0
# Both files fork from one zygote (torch and resiliency.inprocess imported): in one xdist
# worker, so it starts once.
pytestmark = pytest.mark.xdist_group("inprocess_tools_zygote")


@pytest.fixture
def jobs() -> Iterator[list]:
    started: list = []
    yield started
    for job in started:
        if job.poll() is None:
            job.kill()
        job.communicate(DEADLINE_S)  # waits, and closes its output pipe


def _start(jobs: list, tmp_path: Path, faults: str, *, rank=0, world=1, keep_alive=0, wait=30):
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)}
    ticks = tmp_path / f"ticks-{rank}"
    argv = [str(JOB), faults, str(keep_alive), "11", str(ticks), str(wait)]
    job = start_python(MODULES, argv, env, subprocess.PIPE, text=True)
    jobs.append(job)
    return job, ticks


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        ("KILL", -signal.SIGKILL),
        ("TERM", -signal.SIGTERM),
        ("ABORT", -signal.SIGABRT),
        ("SEGFAULT", -signal.SIGSEGV),
        ("ASYNC_EXC", 3),
        ("SIGNAL_EXC", 3),
        ("GPU", 4),  # no CUDA here: refused with a clear error, not a crash in a thread
    ],
)
def test_each_fault_happens_to_the_chosen_rank(
    jobs: list, tmp_path: Path, fault: str, status: int
) -> None:
    job, _ = _start(jobs, tmp_path, fault)
    assert job.wait(DEADLINE_S) == status
    out = job.communicate(DEADLINE_S)[0]
    if status == 4:
        assert "GPU needs a CUDA device" in out
    else:
        assert f"injecting {fault} now" in out, out


def test_a_gil_fault_stops_every_python_thread(jobs: list, tmp_path: Path) -> None:
    job, ticks = _start(jobs, tmp_path, "GIL")
    deadline = time.monotonic() + DEADLINE_S
    last, still_since = -1, time.monotonic()
    while time.monotonic() - still_since < 1.0:  # the ticker thread never gets the GIL again
        assert time.monotonic() < deadline, "the ticks never stopped: the GIL was not held"
        size = ticks.stat().st_size if ticks.exists() else 0
        if size != last:
            last, still_since = size, time.monotonic()
        time.sleep(0.05)
    assert last > 0 and job.poll() is None  # it ticked, and it is alive but silent
    job.kill()
    assert job.wait(DEADLINE_S) == -signal.SIGKILL


def test_a_stop_fault_stops_the_process(jobs: list, tmp_path: Path) -> None:
    job, _ = _start(jobs, tmp_path, "STOP")
    deadline = time.monotonic() + DEADLINE_S
    while Path(f"/proc/{job.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the process was never stopped"
        time.sleep(0.05)
    job.kill()
    assert job.wait(DEADLINE_S) == -signal.SIGKILL


def test_every_rank_draws_the_same_ranks_and_the_first_ones_are_kept_alive(
    jobs: list, tmp_path: Path
) -> None:
    ranks = [
        _start(jobs, tmp_path, "ASYNC_EXC,SIGNAL_EXC", rank=r, world=4, keep_alive=1, wait=5)[0]
        for r in range(4)
    ]
    statuses = [job.wait(DEADLINE_S) for job in ranks]
    outs = [job.communicate(DEADLINE_S)[0] for job in ranks]
    hit = [r for r, status in enumerate(statuses) if status == 3]
    assert set(statuses) <= {0, 3} and 1 <= len(hit) <= 2 and 0 not in hit, outs
    for r in hit:  # each chosen rank names the same draw: exactly the ranks that got a fault
        named = re.search(r"\(seed 11; ranks \[([\d, ]+)\]\)", outs[r])
        assert named is not None, outs[r]
        assert sorted(int(x) for x in named.group(1).split(",")) == hit
