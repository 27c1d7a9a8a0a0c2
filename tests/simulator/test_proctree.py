"""Finding a launcher's ranks from outside: new processes and workers forked by ft-launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from resiliency.simulator import _proctree

pytestmark = pytest.mark.slow

WORKER = """
import os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
(out / f"rank-{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(120)
"""


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _ranks_written(out: Path, n: int, proc: subprocess.Popen[bytes]) -> dict[int, int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = {int(p.stem.split("-")[1]): int(p.read_text()) for p in out.glob("rank-*.pid")}
        if len(found) == n and all(found.values()):
            return found
        assert proc.poll() is None, f"the launcher exited ({proc.returncode})"
        time.sleep(0.2)
    raise AssertionError(f"the workers did not write their pids in 120 s: {found}")


@pytest.mark.parametrize("preimport", [False, True], ids=["popen", "forked"])
def test_workers_are_found_by_rank_whether_started_or_forked(
    launcher: list[subprocess.Popen[bytes]], tmp_path: Path, preimport: bool
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "resiliency.launcher", "--nproc-per-node", "2"]
    command += ["--no-gpu-health-check", "--monitor-interval", "0.1"]
    if preimport:
        command += ["--ft-preimport", "json"]
    proc = subprocess.Popen(
        [*command, str(script), str(out)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    launcher.append(proc)
    written = _ranks_written(out, 2, proc)
    found = {rank: p.pid for rank, p in _proctree.workers(proc.pid).items()}
    assert found == written
    if preimport:
        # Forked workers show the fork server's environment in /proc; their own is published.
        raw = Path(f"/proc/{written[0]}/environ").read_bytes().split(b"\0")
        seen = dict(item.decode().partition("=")[::2] for item in raw if item)
        assert "RANK" not in seen
        published = seen[_proctree.FORKED_ENVIRON_DIR_VAR]
        os.kill(written[1], signal.SIGKILL)
        gone = Path(published) / str(written[1])
        deadline = time.monotonic() + 30
        while gone.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not gone.exists(), "the fork server kept a dead worker's environment"
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(60) is not None
