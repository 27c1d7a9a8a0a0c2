"""RankMonitorClient: clear errors on the cold path; the hot path never blocks nor raises."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from resiliency.ft.client import RankMonitorClient
from resiliency.ft.errors import MonitorUnavailableError


def test_init_without_socket_variable_says_what_to_do(monkeypatch):
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    with pytest.raises(MonitorUnavailableError) as err:
        RankMonitorClient().init_workload_monitoring()
    message = str(err.value)
    assert "FT_RANK_MONITOR_IPC_SOCKET is not set" in message
    assert "ft-launcher" in message


def test_init_with_missing_socket_is_a_clear_error(monkeypatch, sock_dir):
    path = sock_dir / "rank-0.sock"
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", str(path))
    with pytest.raises(
        MonitorUnavailableError, match=f"cannot connect to the rank monitor at {path}"
    ):
        RankMonitorClient().init_workload_monitoring()


def test_hot_calls_before_init_do_not_raise_and_warn_once(caplog):
    client = RankMonitorClient()
    with caplog.at_level(logging.WARNING, logger="resiliency.ft"):
        for _ in range(3):
            client.send_heartbeat()
            client.start_section("step")
            client.end_section("step")
            client.end_all_sections()
    warnings = [r for r in caplog.records if "before init_workload_monitoring" in r.getMessage()]
    assert len(warnings) == 1
    with pytest.raises(MonitorUnavailableError, match="init_workload_monitoring"):
        client.calculate_and_set_hb_timeouts()


@pytest.mark.slow
def test_dead_monitor_is_reported_once_and_the_rank_keeps_going(
    start_monitor, spawn_rank, tmp_path
):
    monitor = start_monitor(rank_section_timeouts={"step": 30.0})
    ready = tmp_path / "ready"
    rank = spawn_rank(
        f"""
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as some programs do: must not matter
        client.send_heartbeat()
        open({str(ready)!r}, "w").close()
        while os.path.exists({str(ready)!r}):  # the test removes it once the monitor is dead
            time.sleep(0.01)
        slowest = 0.0
        for i in range(2000):
            t0 = time.perf_counter()
            client.send_heartbeat()
            client.start_section("step")
            client.end_section("step")
            client.end_all_sections()
            slowest = max(slowest, time.perf_counter() - t0)
        client.shutdown_workload_monitoring()
        print(f"survived; slowest call group {{slowest * 1e3:.3f}} ms")
        """,
        monitor,
    )
    rank.wait_for_file(ready)
    os.kill(monitor.proc.pid, signal.SIGKILL)
    monitor.wait_exited()
    ready.unlink()
    assert rank.wait() == 0, rank.output()
    out = rank.output()
    assert "survived" in out
    assert out.count("is gone") == 1, out
    assert "rank monitor for rank 0 at" in out and "hang detection is OFF for this rank" in out
    assert "Traceback" not in out


@pytest.mark.slow
def test_hot_path_never_blocks_on_a_stalled_monitor(start_monitor, spawn_rank, tmp_path):
    # A stopped monitor reads nothing: the socket buffer fills, section events queue up and the
    # backlog overflows; the rank must not block, and no false hang may follow once it resumes.
    monitor = start_monitor(rank_section_timeouts={"step": 3.0}, rank_heartbeat_timeout=3.0)
    ready = tmp_path / "ready"
    rank = spawn_rank(
        f"""
        client.send_heartbeat()
        open({str(ready)!r}, "w").close()
        while os.path.exists({str(ready)!r}):
            time.sleep(0.01)
        t0 = time.perf_counter()
        for i in range(5000):
            client.start_section("step")
            client.send_heartbeat()
            client.end_section("step")
        print(f"stalled loop took {{time.perf_counter() - t0:.3f}} s", flush=True)
        open({str(ready)!r} + ".done", "w").close()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # keep going after the monitor resumes
            client.start_section("step")
            client.send_heartbeat()
            time.sleep(0.02)
            client.end_section("step")
        client.shutdown_workload_monitoring()
        print("clean exit")
        """,
        monitor,
    )
    rank.wait_for_file(ready)
    os.kill(monitor.proc.pid, signal.SIGSTOP)
    try:
        ready.unlink()
        rank.wait_for_file(tmp_path / "ready.done")
    finally:
        os.kill(monitor.proc.pid, signal.SIGCONT)
    assert rank.wait(20) == 0, rank.output()
    out = rank.output()
    assert "clean exit" in out
    loop_s = float(out.split("stalled loop took ")[1].split(" s")[0])
    assert loop_s < 5.0  # 15000 calls; blocking even once would hang until SIGCONT
    assert "resynchronizing" in out
    events = monitor.drain(0.3)
    assert not any(e.kind == "hang" for e in events), monitor.log()


@pytest.mark.slow
def test_ending_an_unopened_section_warns_and_bad_names_are_ignored(start_monitor, spawn_rank):
    monitor = start_monitor()
    rank = spawn_rank(
        """
        import logging
        logging.basicConfig(level=logging.WARNING)
        client.end_section("never_opened")
        client.end_section("never_opened")
        client.start_section("")
        client.start_section("x" * 1000)
        client.start_section("step")
        client.start_section("step")
        client.end_section("step")
        client.send_heartbeat()
        client.shutdown_workload_monitoring()
        print("ok")
        """,
        monitor,
    )
    assert rank.wait() == 0, rank.output()
    out = rank.output()
    assert out.count("section 'never_opened' ended but it is not open") == 1
    assert "section 'step' started again while open" in out
    assert out.count("section ignored: section name must be a string of 1 to 256") == 2
    assert "Traceback" not in out


_STACK_DUMP_RANK = """
import logging
import signal
logging.basicConfig(level=logging.WARNING)
from resiliency.ft import RankMonitorClient
if {own_handler}:
    signal.signal(signal.SIGUSR2, lambda *a: print("the job's own handler"))
client = RankMonitorClient()
client.init_workload_monitoring()
client.shutdown_workload_monitoring()
"""


@pytest.mark.parametrize("own_handler", [True, False], ids=["job-handler", "free-signal"])
def test_taking_over_a_signal_handler_for_the_stack_dump_is_said(
    start_monitor, spawn_rank, own_handler: bool
):
    monitor = start_monitor(enable_stack_dump=True, stack_dump_signal="SIGUSR2")
    rank = spawn_rank(_STACK_DUMP_RANK.format(own_handler=own_handler), monitor, prelude=False)
    assert rank.wait() == 0, rank.output()
    out = rank.output()
    said = "the stack dump on a hang takes SIGUSR2" in out and "stack_dump_signal" in out
    assert said == own_handler, out
