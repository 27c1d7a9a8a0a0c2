"""A rank monitor's SIGTERM for a hang is not a preemption; a SIGTERM from outside still is.

Real processes: a rank monitor (``python -m resiliency.ft.server``) and a rank that runs an
``EmergencyCheckpoint`` on a real c10d TCPStore hosted by the test. The rank's hang ends once the
SIGTERM reached it, so before the fix it went on to propose a stop to every rank and save
(exit 75); now it dies by the signal, as it would without the emergency checkpoint.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from resiliency.ft import FaultToleranceConfig, MonitorProcess, create_socket_dir

pytestmark = pytest.mark.slow

_PREEMPTED = 75
_STOP_KEY = "resiliency/emergency/stop_at"

_RANK = """
import os, sys, time
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
from resiliency.checkpoint import EmergencyCheckpoint
from resiliency.ft import RankMonitorClient

mode, port, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
client = RankMonitorClient()


def leave(code):
    # Say 'bye' first: a slow interpreter teardown is no hang.
    client.shutdown_workload_monitoring()
    sys.exit(code)


ec = EmergencyCheckpoint(
    lambda step, state: (out / "saved").write_text(str(step)),
    store=store,
    lead=1,
    max_drift=0,
    exit_fn=leave,
)
client.init_workload_monitoring()
deadline = time.monotonic() + 120
for step in range(1, 10_000):
    if step <= 3 or mode == "run":
        client.send_heartbeat()
    if step == 3:
        (out / "ready").write_text(str(os.getpid()))
        # "hang" stops heartbeating here (a rank stuck in a read that ends later), "run" goes
        # on beating; both wait for a SIGTERM, then carry on training.
        while not ec.signal_received and time.monotonic() < deadline:
            time.sleep(0.02)
            if mode == "run":
                client.send_heartbeat()
    if ec.should_stop(step):
        ec.save_and_exit(step, {})
    time.sleep(0.02)
"""


class _Host:
    """The job's c10d store, hosted here; :meth:`close` drops the last reference (torch then
    closes its sockets)."""

    def __init__(self) -> None:
        self.store: _Host | None = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60)
        )

    def stop_proposed(self) -> bool:
        assert self.store is not None
        return bool(self.store.check([_STOP_KEY]))

    @property
    def port(self) -> int:
        assert self.store is not None
        return int(self.store.port)

    def close(self) -> None:
        self.store = None
        gc.collect()


@pytest.fixture
def store() -> Iterator[_Host]:
    host = _Host()
    yield host
    host.close()


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[MonitorProcess]:
    sock_dir = create_socket_dir("ft-term-")
    cfg = FaultToleranceConfig(
        initial_rank_heartbeat_timeout=60.0,
        rank_heartbeat_timeout=1.0,
        workload_check_interval=0.2,
        stack_dump_timeout=2.0,
        termination_grace_period=60.0,  # the rank must show what it does after the SIGTERM
    )
    with open(tmp_path / "monitor.log", "wb") as log:
        proc = MonitorProcess.start(cfg, sock_dir / "rank-0.sock", 0, stderr=log, start_timeout=60)
    yield proc
    proc.stop(timeout=5.0)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture
def rank(tmp_path: Path, store: _Host, monitor: MonitorProcess) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(mode: str) -> subprocess.Popen[bytes]:
        script = tmp_path / "rank.py"
        script.write_text(textwrap.dedent(_RANK))
        env = {
            **os.environ,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "FT_RANK_MONITOR_IPC_SOCKET": str(monitor.socket_path),
            "RESILIENCY_PREEMPTED_EXIT_CODE": str(_PREEMPTED),
        }
        with open(tmp_path / "rank.out", "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, str(script), mode, str(store.port), str(tmp_path)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(popen)
        monitor.worker_started(popen.pid, rank=0)
        return popen

    yield spawn
    for popen in procs:
        if popen.poll() is None:
            popen.kill()
        popen.wait(10)


def _wait_exit(popen: subprocess.Popen[bytes], out: Path, timeout: float = 90.0) -> int:
    try:
        return popen.wait(timeout)
    except subprocess.TimeoutExpired:
        log = (out / "rank.out").read_text(errors="replace")
        raise AssertionError(f"the rank still runs after {timeout} s; output:\n{log}") from None


def _wait_ready(popen: subprocess.Popen[bytes], out: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (out / "ready").exists():
        log = (out / "rank.out").read_text(errors="replace")
        assert popen.poll() is None, f"the rank exited ({popen.returncode}) early:\n{log}"
        assert time.monotonic() < deadline, f"the rank did not reach step 3 in {timeout} s:\n{log}"
        time.sleep(0.05)


def test_a_hung_rank_terminated_by_its_monitor_proposes_no_emergency_stop(
    rank, monitor: MonitorProcess, store: _Host, tmp_path: Path
) -> None:
    popen = rank("hang")
    code = _wait_exit(popen, tmp_path)
    log = (tmp_path / "rank.out").read_text(errors="replace")
    assert code == -signal.SIGTERM, f"exit {code}, expected death by SIGTERM; output:\n{log}"
    assert not store.stop_proposed(), "the monitor's termination proposed an emergency stop"
    assert not (tmp_path / "saved").exists()
    kinds = [e.kind for e in monitor.poll_events(timeout=5.0)]
    assert "hang" in kinds, kinds
    # The mark is back to 0 once the rank is gone: the next worker's SIGTERM is judged afresh.
    mark = monitor.socket_path.parent / "rank-0-terminating"
    deadline = time.monotonic() + 30
    while mark.read_bytes() != b"\0":
        assert time.monotonic() < deadline, "the termination mark stayed set"
        time.sleep(0.05)


def test_a_sigterm_from_outside_still_stops_every_rank_with_a_save(
    rank, store: _Host, tmp_path: Path
) -> None:
    popen = rank("run")
    _wait_ready(popen, tmp_path)
    os.kill(popen.pid, signal.SIGTERM)
    code = _wait_exit(popen, tmp_path)
    log = (tmp_path / "rank.out").read_text(errors="replace")
    assert code == _PREEMPTED, f"exit {code}, expected the emergency exit; output:\n{log}"
    assert store.stop_proposed()
    assert (tmp_path / "saved").exists()
