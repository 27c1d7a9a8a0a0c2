"""A rank slow inside its backward pass under DDP: wall-time scores miss it, the section timed
net of the all-reduce wait names it (3 real gloo processes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

WORLD = 3
SLOW_RANK = 2
DELAY_S = 0.2
WORKER = Path(__file__).with_name("_ddp_worker.py")
DEADLINE_S = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp")
    port = _free_port()
    argv = [str(port), str(out), str(SLOW_RANK), str(DELAY_S)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(WORLD), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(WORLD)
    ]
    logs = {}
    try:
        deadline = time.monotonic() + DEADLINE_S
        for rank, proc in enumerate(procs):
            output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs[rank] = output.decode(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    failed = {r: p.returncode for r, p in enumerate(procs) if p.returncode != 0}
    assert not failed, f"workers failed {failed}:\n" + "\n".join(
        f"--- rank {r}\n{logs.get(r, '')[-3000:]}" for r in failed
    )
    return json.loads((out / "report.json").read_text())


def test_wall_time_scores_miss_the_rank_slow_in_its_backward_pass(report: dict) -> None:
    wall = report["scores"]["step"]
    assert min(wall.values()) > 0.75, wall  # DDP's all-reduce evens the steps out
    assert "step" not in report["stragglers"]


def test_the_section_net_of_the_all_reduce_wait_names_it(report: dict) -> None:
    net = report["scores"]["step net of all-reduce wait"]
    assert net[str(SLOW_RANK)] < 0.5, net
    assert all(score > 0.75 for rank, score in net.items() if rank != str(SLOW_RANK)), net
    assert report["stragglers"] == {"step net of all-reduce wait": [SLOW_RANK]}
    assert report["blocked_s"] > 0  # rank 0 waited for the slow rank
