"""An emergency checkpoint through a tiered manager lands on every tier, whatever the cadence,
and the rank's exit after it waits neither for its writer processes nor past the deadline."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from resiliency.checkpoint import (
    AppState,
    CheckpointManager,
    EmergencyCheckpoint,
    LocalTier,
    PersistentTier,
    WriterFailedError,
)

pytestmark = pytest.mark.timeout(180)

# From the 'saved' log line to save_and_exit's end: writing the exit info and closing the
# manager, milliseconds. It was 5 s and more while the close waited for a starting writer.
EXIT_BOUND_S = 2.0


def _tiers(tmp_path: Path) -> list[LocalTier | PersistentTier]:
    return [
        LocalTier(tmp_path / "local", every=10, replicas=0),
        PersistentTier(tmp_path / "persistent", every=100),
    ]


def _state() -> dict[str, AppState]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return {"app": AppState(model, torch.optim.AdamW(model.parameters()))}


def _writer_children() -> set[int]:
    """This process's children that are checkpoint writers (running or not yet reaped)."""
    writers: set[int] = set()
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            with contextlib.suppress(FileNotFoundError):  # reaped since the listing
                if b"resiliency.checkpoint._writer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    writers.add(int(pid))
    return writers


def _wait_no_writers(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while left := _writer_children():
        if time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"writer processes {sorted(left)} not gone within {timeout} s")
        time.sleep(0.02)


def _stop_step(ec: EmergencyCheckpoint, first: int = 1) -> int:
    os.kill(os.getpid(), signal.SIGTERM)
    return next(step for step in range(first, first + 50) if ec.should_stop(step))


def test_emergency_step_is_saved_on_every_tier(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    state = {"app": AppState(model, opt)}
    manager = CheckpointManager(
        None,
        tiers=[
            LocalTier(tmp_path / "local", every=10, replicas=0),
            PersistentTier(tmp_path / "persistent", every=100),
        ],
    )
    codes: list[int] = []
    ec = EmergencyCheckpoint(manager, lead=2, exit_fn=codes.append)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        stop = next(step for step in range(1, 50) if ec.should_stop(step))
        assert stop % 10 != 0, "pick a step that no tier's cadence divides"
        with pytest.raises(SystemExit) as exited:
            ec.save_and_exit(stop, state)
        assert exited.value.code == 0 and codes == [0]
        assert (tmp_path / "local" / f"step_{stop:09d}").is_dir()
        assert (tmp_path / "persistent" / f"step_{stop:09d}").is_dir()
    finally:
        ec.close()
        manager.close()


def test_the_exit_does_not_wait_for_writers_that_are_still_starting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo's preemption: the stop comes while the local tier's writer still imports torch
    (after a restart, niced, on a busy node) and the persistent tier's writer starts only at
    the emergency save; the rank's close of both must not wait for them."""
    caplog.set_level(logging.WARNING, logger="resiliency.checkpoint")
    state = _state()
    manager = CheckpointManager(None, tiers=_tiers(tmp_path))
    local_writer = manager._tiered.local._writer
    os.kill(local_writer.pid, signal.SIGSTOP)  # starved of CPU: still importing, for seconds
    assert not local_writer.poll_ready(), "the local writer said ready within ms of its spawn"
    codes: list[int] = []
    ec = EmergencyCheckpoint(manager, lead=2, exit_fn=codes.append)
    try:
        stop = _stop_step(ec)
        with pytest.raises(SystemExit):
            ec.save_and_exit(stop, state)
        took = time.time() - next(r.created for r in caplog.records if "saved on" in r.getMessage())
        assert codes == [0], caplog.text
        assert took < EXIT_BOUND_S, f"the exit took {took:.2f} s after the save was committed"
        assert (tmp_path / "local" / f"step_{stop:09d}").is_dir()
        assert (tmp_path / "persistent" / f"step_{stop:09d}" / "manifest.json").is_file()
        _wait_no_writers(10)  # killed (never ready) and reaped off the rank's thread
    finally:
        ec.close()
        manager.close()
        with contextlib.suppress(ProcessLookupError):  # reaped above unless the test failed
            os.kill(local_writer.pid, signal.SIGKILL)


def test_an_earlier_save_in_flight_is_waited_for_until_the_deadline_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the local tier fits the budget; a persistent save started earlier is still in flight
    (its writer stuck). The rank waits for it until SIGKILL's deadline less the margin, not for
    the writer timeout, and says so."""
    caplog.set_level(logging.WARNING, logger="resiliency.checkpoint")
    state = _state()
    manager = CheckpointManager(None, tiers=_tiers(tmp_path), writer_timeout_s=60.0)
    manager.save(1, state, tier="persistent").wait()  # starts the persistent tier's writer
    writer = manager._tiered.persistent._writer
    writer.wait_ready(writer.deadline(120))
    os.kill(writer.pid, signal.SIGSTOP)  # its next save never finishes
    manager.save(2, state, tier="persistent")
    codes: list[int] = []
    term_timeout, margin = 6.0, 2.0
    ec = EmergencyCheckpoint(
        manager,
        lead=2,
        exit_fn=codes.append,
        term_timeout_s=term_timeout,
        expected_save_s=60.0,  # a full save does not fit: the local tier only
        margin_s=margin,
    )
    try:
        signalled = time.monotonic()
        stop = _stop_step(ec, first=3)
        with pytest.raises(SystemExit):
            ec.save_and_exit(stop, state)
        took = time.monotonic() - signalled
        assert codes == [0], caplog.text
        assert term_timeout - margin - 1.0 < took < term_timeout, caplog.text
        assert (
            f"emergency stop at step {stop}: the save of step 2 is still in flight at the "
            "deadline" in caplog.text
        )
        assert (tmp_path / "local" / f"step_{stop:09d}").is_dir()
        assert manager.steps() == [1, stop]
    finally:
        ec.close()
        os.kill(writer.pid, signal.SIGKILL)
        with pytest.raises(WriterFailedError, match="step 2"):
            manager.close()  # the abandoned save, settled now that its writer is gone
