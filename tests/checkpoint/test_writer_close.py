"""Closing a writer process: one still starting is killed at once (it was never sent a save),
a ready one is told to exit and is gone when close() returns.

A rank that closes its manager on its way out (an emergency stop) sends no heartbeat meanwhile;
a close that waited seconds for a starting writer's imports was taken for a hang by its monitor.
A stopped writer (SIGSTOP) stands for one starved of CPU on a busy node (writers run niced).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from resiliency.checkpoint._writer.client import WriterProcess

pytestmark = pytest.mark.timeout(180)

CLOSE_BOUND_S = 1.0  # a kill, or an idle writer's exit on 'exit': milliseconds


def wait_reaped(pid: int, timeout: float) -> None:
    """Wait until ``pid`` is gone from /proc (exited and reaped, not a zombie)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"writer pid {pid} not exited and reaped within {timeout} s")
        time.sleep(0.02)


def _closed_in(writer: WriterProcess, **kwargs: float) -> float:
    t0 = time.monotonic()
    writer.close(**kwargs)
    return time.monotonic() - t0


def test_closing_a_starting_writer_kills_it_without_waiting() -> None:
    writer = WriterProcess()
    try:
        os.kill(writer.pid, signal.SIGSTOP)  # still importing torch, and gets no CPU
        assert not writer.poll_ready(), "the writer said ready within milliseconds of its spawn"
        took = _closed_in(writer)
        assert took < CLOSE_BOUND_S, f"close() waited {took:.2f} s for a writer that never started"
        wait_reaped(writer.pid, 10)
    finally:
        writer.kill()  # a no-op once it is reaped


def test_a_ready_idle_writer_exits_when_closed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="resiliency.checkpoint")
    writer = WriterProcess()
    writer.wait_ready(writer.deadline(120))
    took = _closed_in(writer, timeout=60.0)
    assert took < CLOSE_BOUND_S, f"close() waited {took:.2f} s for an idle writer to exit"
    assert not Path(f"/proc/{writer.pid}").exists(), "close() returned before reaping it"
    assert "did not exit" not in caplog.text  # it left on 'exit', not by the kill
