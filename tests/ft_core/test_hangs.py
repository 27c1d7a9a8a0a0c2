"""Each kind of hang is detected, named in the log, dumped (when the rank connected) and killed.

Real monitor subprocesses and real rank subprocesses; timeouts of about a second; bounds generous
enough for a loaded 2-core machine.
"""

from __future__ import annotations

import signal
import time

import pytest

pytestmark = pytest.mark.slow


def _assert_killed(monitor, rank, timer: str, function: str | None, signal_name: str = "SIGTERM"):
    hang = monitor.wait_event("hang", pid=rank.pid)
    killed = monitor.wait_event("killed", pid=rank.pid)
    assert hang.timer == timer
    assert killed.timer == timer
    assert killed.signal == signal_name
    assert hang.elapsed is not None and hang.limit is not None
    assert hang.elapsed > hang.limit
    code = rank.wait(10)
    assert code == -getattr(signal, signal_name)
    log = monitor.log()
    assert f"[timer: {timer}]" in log
    assert f"sent {'SIGTERM'} to rank 0 (pid {rank.pid})" in log
    if function is None:
        assert hang.stack_dump is None
        assert "no stack dump of rank 0" in log
    else:
        assert hang.stack_dump is not None and function in hang.stack_dump
        assert f"stack dump of rank 0 (pid {rank.pid}):" in log
        assert f"in {function}" in log
    return hang


def test_rank_that_hangs_during_import_is_killed(start_monitor, spawn_rank, tmp_path):
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(120)\n")
    monitor = start_monitor(rank_startup_timeout=1.0)
    started = time.monotonic()
    rank = spawn_rank("import slow_module\n", monitor, prelude=False)
    hang = _assert_killed(monitor, rank, "startup", None)
    # The startup timer runs from the spawn (worker_started): the rank never connected at all.
    # Expected about 1 s (the timeout) and a couple more to kill and reap the rank; the upper
    # bounds only catch a timer that fires far too late, so they are 10x that and more.
    assert 1.0 < hang.elapsed < 20.0
    assert time.monotonic() - started < 40.0
    assert "has not called init_workload_monitoring() since it was started" in monitor.log()
    assert not any(e.kind == "rank_connected" for e in monitor.events)


def test_rank_that_stops_heartbeating_is_killed(start_monitor, spawn_rank):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    rank = spawn_rank(
        """
        for _ in range(5):
            client.send_heartbeat()
            time.sleep(0.05)

        def stopped_heart_beating():
            time.sleep(120)

        stopped_heart_beating()
        """,
        monitor,
    )
    hang = _assert_killed(monitor, rank, "heartbeat", "stopped_heart_beating")
    assert hang.elapsed < 20.0  # expected just over the 1 s timeout; 10x and more
    assert "no heartbeat for" in monitor.log()


def test_rank_stuck_in_a_section_is_killed(start_monitor, spawn_rank):
    monitor = start_monitor(rank_section_timeouts={"step": 1.0})
    rank = spawn_rank(
        """
        client.send_heartbeat()

        def stuck_inside_section():
            client.start_section("step")
            time.sleep(120)

        stuck_inside_section()
        """,
        monitor,
    )
    _assert_killed(monitor, rank, "section:step", "stuck_inside_section")
    assert "section 'step' open for" in monitor.log()


def test_rank_stuck_out_of_section_is_killed(start_monitor, spawn_rank):
    monitor = start_monitor(rank_section_timeouts={"step": 5.0}, rank_out_of_section_timeout=1.0)
    rank = spawn_rank(
        """
        for _ in range(3):
            client.start_section("step")
            time.sleep(0.05)
            client.end_section("step")

        def idle_between_sections():
            time.sleep(120)

        idle_between_sections()
        """,
        monitor,
    )
    _assert_killed(monitor, rank, "out_of_section", "idle_between_sections")
    assert "no section open for" in monitor.log()


def test_expired_outer_section_is_not_hidden_by_fresh_inner_one(start_monitor, spawn_rank):
    monitor = start_monitor(
        rank_section_timeouts={"outer": 1.5, "inner": 0.8}, rank_heartbeat_timeout=0.8
    )
    rank = spawn_rank(
        """
        def busy_in_outer_section():
            client.start_section("outer")
            while True:  # the inner section and the heartbeats stay fresh
                client.start_section("inner")
                client.send_heartbeat()
                time.sleep(0.05)
                client.end_section("inner")

        busy_in_outer_section()
        """,
        monitor,
    )
    hang = _assert_killed(monitor, rank, "section:outer", "busy_in_outer_section")
    assert hang.limit == 1.5


def test_steady_rank_is_never_killed(start_monitor, spawn_rank):
    monitor = start_monitor(
        rank_heartbeat_timeout=0.5,
        rank_section_timeouts={"step": 0.5},
        rank_out_of_section_timeout=0.5,
    )
    rank = spawn_rank(
        """
        deadline = time.monotonic() + 3.0  # six timeout periods
        while time.monotonic() < deadline:
            client.start_section("step")
            client.send_heartbeat()
            time.sleep(0.03)
            client.end_section("step")
            time.sleep(0.01)
        client.shutdown_workload_monitoring()
        print("finished")
        """,
        monitor,
    )
    assert rank.wait(20) == 0, rank.output()
    assert "finished" in rank.output()
    events = monitor.drain(0.5)
    assert [e.kind for e in events if e.kind in ("hang", "killed")] == []
    assert "hung" not in monitor.log()
    assert "finished cleanly" in monitor.log()


def test_restarted_rank_reconnects_to_the_same_monitor(start_monitor, spawn_rank):
    monitor = start_monitor(rank_section_timeouts={"step": 1.0})
    first = spawn_rank(
        """
        client.send_heartbeat()
        sys.exit(3)  # a crash: no 'bye'
        """,
        monitor,
    )
    assert first.wait() == 3
    monitor.wait_event("rank_disconnected", pid=first.pid)
    second = spawn_rank(
        """
        client.send_heartbeat()

        def hang_after_restart():
            client.start_section("step")
            time.sleep(120)

        hang_after_restart()
        """,
        monitor,
        restart=1,
    )
    assert monitor.wait_event("rank_connected", pid=second.pid).pid != first.pid
    _assert_killed(monitor, second, "section:step", "hang_after_restart")
    assert monitor.proc.is_alive()
    assert "restart 1" in monitor.log()
    assert all(e.pid != first.pid for e in monitor.events if e.kind in ("hang", "killed"))


def test_rank_ignoring_sigterm_gets_sigkill_after_grace_period(start_monitor, spawn_rank):
    monitor = start_monitor(rank_heartbeat_timeout=1.0, termination_grace_period=0.5)
    rank = spawn_rank(
        """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        client.send_heartbeat()

        def deaf_to_sigterm():
            time.sleep(120)

        deaf_to_sigterm()
        """,
        monitor,
    )
    _assert_killed(monitor, rank, "heartbeat", "deaf_to_sigterm", signal_name="SIGKILL")
    assert "sending SIGKILL" in monitor.log()


def test_launcher_stopping_the_worker_disarms_its_timers(start_monitor, spawn_rank):
    monitor = start_monitor(rank_heartbeat_timeout=0.5)
    rank = spawn_rank("client.send_heartbeat()\ntime.sleep(120)\n", monitor)
    monitor.wait_event("rank_connected", pid=rank.pid)
    monitor.proc.worker_stopped()
    events = monitor.drain(1.5)  # waiting for nothing to happen: three 0.5 s heartbeat timeouts
    assert not any(e.kind == "hang" for e in events)
    assert rank.popen.poll() is None


def test_late_connecting_rank_that_exits_without_heartbeat_is_not_hung(start_monitor, spawn_rank):
    # Issue 10's failure mode: initial_rank_heartbeat_timeout 3 s, a rank whose imports take
    # longer than that before init_workload_monitoring(), which then exits 0 without ever sending
    # a heartbeat. The initial timer runs from the connection, so this is not a hang.
    monitor = start_monitor(initial_rank_heartbeat_timeout=3.0, rank_startup_timeout=60.0)
    rank = spawn_rank(
        """
        import time
        time.sleep(4.0)  # slow imports, longer than the initial-heartbeat timeout
        from resiliency.ft import RankMonitorClient
        client = RankMonitorClient()
        client.init_workload_monitoring()
        time.sleep(0.5)
        client.shutdown_workload_monitoring()
        """,
        monitor,
        prelude=False,
    )
    assert rank.wait(30) == 0
    events = monitor.drain(1.0)
    assert not any(e.kind in ("hang", "killed") for e in events), monitor.log()
    assert any(e.kind == "rank_connected" for e in events)


def test_initial_timer_runs_from_the_connection(start_monitor, spawn_rank):
    monitor = start_monitor(initial_rank_heartbeat_timeout=1.5, rank_startup_timeout=60.0)
    rank = spawn_rank(
        """
        import time
        time.sleep(2.5)  # longer than the initial timeout, before connecting: not counted
        from resiliency.ft import RankMonitorClient
        client = RankMonitorClient()
        print("connecting at", repr(time.monotonic()), flush=True)
        client.init_workload_monitoring()

        def never_sends_a_heartbeat():
            time.sleep(120)

        never_sends_a_heartbeat()
        """,
        monitor,
        prelude=False,
    )
    hang = _assert_killed(monitor, rank, "initial", "never_sends_a_heartbeat")
    seen_at = time.monotonic()
    # Counted from init_workload_monitoring(), so the 2.5 s of "imports" are not in it. Not a
    # speed bound: the timer cannot have run longer than the rank has been connecting (the
    # monotonic clock is system-wide), whereas one run from the spawn would be at least 2.5 s
    # longer, which only a hang event delayed by more than that could hide.
    connecting_at = float(rank.output().split("connecting at ")[1].split()[0])
    assert 1.5 < hang.elapsed <= seen_at - connecting_at
    assert "no first heartbeat or section since init_workload_monitoring()" in monitor.log()


def test_block_that_raises_stays_watched_through_a_hung_teardown(start_monitor, spawn_rank):
    # Issue 30, item 3: the exception must not switch hang detection off (no 'bye'), so a
    # teardown that hangs after it (a stuck NCCL teardown) is still found and killed.
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    rank = spawn_rank(
        """
        import time
        from resiliency.ft import RankMonitorClient

        def stuck_teardown():
            time.sleep(120)

        try:
            with RankMonitorClient() as block_client:
                block_client.send_heartbeat()
                raise RuntimeError("injected failure in the training loop")
        finally:
            stuck_teardown()
        """,
        monitor,
        prelude=False,
    )
    # The prelude is left out: the block's own client is the rank's only connection.
    hang = _assert_killed(monitor, rank, "heartbeat", "stuck_teardown")
    assert hang.elapsed < 20.0
    log = monitor.log()
    assert "finished cleanly" not in log
    assert "leaving the monitored block with RuntimeError" in rank.output()


def test_block_that_ends_cleanly_says_goodbye(start_monitor, spawn_rank):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    rank = spawn_rank(
        """
        import time
        from resiliency.ft import RankMonitorClient

        with RankMonitorClient() as block_client:
            block_client.send_heartbeat()
        print("left the block", flush=True)
        time.sleep(3)  # unwatched after a clean block: never a hang
        """,
        monitor,
        prelude=False,
    )
    assert rank.wait(30) == 0, rank.output()
    assert "finished cleanly; its timers are disarmed" in monitor.log()
    assert not any(e.kind == "hang" for e in monitor.drain(0.5))


def test_rank_that_closes_its_connection_gets_its_exit_watched_not_its_heartbeats(
    start_monitor, spawn_rank
):
    # Issue 28: a rank that connects and exits without a heartbeat or 'bye' (NVIDIA's config-dump
    # launcher scenario) tears its interpreter down after its connection closed; that teardown
    # may outlast the initial timeout and unregisters faulthandler. It is neither a hang nor a
    # target for the (moved) dump signal, whose default action would kill it.
    monitor = start_monitor(initial_rank_heartbeat_timeout=1.0, rank_termination_signal="SIGUSR2")
    rank = spawn_rank(
        """
        import gc
        assert client.cfg.stack_dump_signal == signal.SIGUSR1
        del client
        gc.collect()  # the socket closes without 'bye', as in interpreter teardown
        print("closed", flush=True)
        time.sleep(3)  # a slow teardown, three times the initial timeout
        """,
        monitor,
    )
    assert rank.wait(30) == 0, rank.output()
    log = monitor.log()
    assert "closed its connection without 'bye'; watching its exit (limit 30 s" in log, log
    assert " hung: " not in log, log
    assert not any(e.kind == "hang" for e in monitor.drain(0.5))
