"""MonitorProcess and the monitor's life cycle: start, events, shutdown, orphan protection."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from resiliency.ft._proc import pid_alive
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.control import MonitorProcess
from resiliency.ft.errors import MonitorUnavailableError

pytestmark = pytest.mark.slow


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_workload_control_request_reaches_the_controller(start_monitor, spawn_rank):
    monitor = start_monitor()
    rank = spawn_rank(
        """
        from resiliency.ft import WorkloadAction, WorkloadControlRequest
        client.send_workload_control_request(
            WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "GPU 3 has ECC errors")
        )
        client.shutdown_workload_monitoring()
        """,
        monitor,
        rank=5,
    )
    event = monitor.wait_event("wlc", pid=rank.pid)
    assert event.action == "ExcludeThisNode"
    assert event.desc == "GPU 3 has ECC errors"
    assert event.rank == 5
    assert event.local_rank == 0
    assert rank.wait() == 0, rank.output()
    assert "requests ExcludeThisNode: GPU 3 has ECC errors" in monitor.log()


def test_monitor_exits_when_its_controller_dies(sock_dir, tmp_path):
    launcher = tmp_path / "launcher.py"
    launcher.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from resiliency.ft import FaultToleranceConfig, MonitorProcess
            mon = MonitorProcess.start(FaultToleranceConfig(), {str(sock_dir / "rank-0.sock")!r}, 0)
            print(mon.pid, flush=True)
            time.sleep(120)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(launcher)], stdout=subprocess.PIPE)
    monitor_pid = None
    try:
        assert proc.stdout is not None
        monitor_pid = int(proc.stdout.readline())
        assert pid_alive(monitor_pid)
        proc.kill()  # the launcher dies without a word
        proc.wait(5)
        assert _wait_gone(monitor_pid, 30), "the monitor outlived its controller"
        assert not (sock_dir / "rank-0.sock").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        if monitor_pid is not None and pid_alive(monitor_pid):
            os.kill(monitor_pid, signal.SIGKILL)


def test_sigterm_stops_the_monitor_and_removes_its_socket(start_monitor):
    monitor = start_monitor()
    path = monitor.socket_path
    assert path.exists()
    os.kill(monitor.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while monitor.proc.is_alive():
        assert time.monotonic() < deadline, "the monitor ignored SIGTERM"
        time.sleep(0.02)
    assert monitor.proc.stop() == 0
    assert not path.exists()
    assert "exiting: received SIGTERM" in monitor.log()
    with pytest.raises(MonitorUnavailableError):
        monitor.proc.worker_started(os.getpid())


def test_stop_is_clean_and_idempotent(start_monitor):
    monitor = start_monitor()
    assert monitor.proc.stop() == 0
    assert monitor.proc.stop() == 0
    assert not monitor.socket_path.exists()
    assert "exiting: the controller asked for shutdown" in monitor.log()


def test_start_reports_a_monitor_that_cannot_start(start_monitor, sock_dir, tmp_path):
    start_monitor()  # already listening on rank-0.sock
    log_path = tmp_path / "second.log"
    with open(log_path, "wb") as log, pytest.raises(MonitorUnavailableError) as err:
        MonitorProcess.start(
            FaultToleranceConfig(), sock_dir / "rank-0.sock", 0, stderr=log, start_timeout=60
        )
    assert "exited with code 2" in str(err.value)
    assert "another rank monitor already listens" in log_path.read_text()


def test_second_controller_is_refused(start_monitor):
    monitor = start_monitor()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
        raw.settimeout(5)
        raw.connect(str(monitor.socket_path))
        hello = {"t": "hello", "v": 1, "role": "controller", "pid": os.getpid()}
        raw.send(json.dumps(hello).encode())
        reply = json.loads(raw.recv(70000))
    assert reply["t"] == "error"
    assert "another controller" in reply["msg"]
    assert monitor.proc.is_alive()


def test_stack_dump_on_request_leaves_the_worker_running(start_monitor, spawn_rank):
    monitor = start_monitor(rank_heartbeat_timeout=30.0)
    rank = spawn_rank(
        """
        def waiting_for_the_slow_peer():
            while True:
                client.send_heartbeat()
                time.sleep(0.05)

        print("ready", flush=True)
        waiting_for_the_slow_peer()
        """,
        monitor,
        rank=2,
    )
    monitor.wait_event("rank_connected", pid=rank.pid)
    rank.wait_for_output("ready")
    monitor.proc.request_stack_dump()
    event = monitor.wait_event("stacks", pid=rank.pid)
    assert event.rank == 2 and event.stack_dump is not None
    assert "waiting_for_the_slow_peer" in event.stack_dump
    # Waiting for something not to happen: a kill mistakenly chained to the dump would follow it
    # at once, so two of the monitor's 1 s check intervals are ample to see it.
    events = monitor.drain(2.0)
    assert not any(e.kind in ("hang", "killed") for e in events), monitor.log()
    assert rank.popen.poll() is None, "a requested dump must not stop the worker"
    assert "hung" not in monitor.log()


def test_stack_dump_request_without_a_worker_answers_none(start_monitor):
    monitor = start_monitor()
    monitor.proc.request_stack_dump()
    event = monitor.wait_event("stacks")
    assert event.stack_dump is None and event.raw.get("msg") == "no connected worker to dump"


def test_after_a_stop_the_next_worker_may_connect_before_it_is_announced(start_monitor, spawn_rank):
    # A worker forked from ft-launcher's fork server connects within milliseconds, before the
    # launcher has told the monitor its pid: it must be adopted, not refused as a stranger.
    monitor = start_monitor(rank_heartbeat_timeout=30.0)
    first = spawn_rank("client.send_heartbeat()\ntime.sleep(60)\n", monitor, rank=0)
    monitor.wait_event("rank_connected", pid=first.pid)
    monitor.proc.worker_stopped()
    first.popen.kill()
    first.popen.wait(10)
    second = spawn_rank(
        "client.send_heartbeat()\nclient.shutdown_workload_monitoring()\n",
        monitor,
        rank=0,
        restart=1,
        announce=False,
    )
    monitor.wait_event("rank_connected", pid=second.pid)
    monitor.proc.worker_started(second.pid)  # the launcher's announcement, after the connect
    assert second.wait() == 0, second.output()
    assert "refused" not in monitor.log()
