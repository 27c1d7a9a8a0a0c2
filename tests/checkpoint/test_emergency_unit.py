"""EmergencyCheckpoint in one process: configuration rules, signal handling, agreement, budget."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from resiliency.checkpoint import (
    EXIT_INFO_DIR_ENV,
    PREEMPTED_EXIT_CODE_ENV,
    TERM_TIMEOUT_ENV,
    CheckpointError,
    EmergencyCheckpoint,
    EmergencyCheckpointError,
)
from resiliency.checkpoint._emergency.agreement import StopAgreement, StopRecord


class Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _raise_exit(code: int) -> None:
    raise Exited(code)


class Saves:
    """A save callable that records what it saved."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, Any]] = []
        self.fail = fail

    def __call__(self, step: int, state: Any) -> None:
        self.calls.append((step, state))
        if self.fail:
            raise OSError(28, "No space left on device")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (EXIT_INFO_DIR_ENV, PREEMPTED_EXIT_CODE_ENV, TERM_TIMEOUT_ENV, "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


def _ec(monkeypatch: pytest.MonkeyPatch, rank: int, world: int, **kw: Any) -> EmergencyCheckpoint:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    kw.setdefault("exit_fn", _raise_exit)
    return EmergencyCheckpoint(kw.pop("save", Saves()), **kw)


# --- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"lead": 1}, "use lead >= 2"),
        ({"lead": 3, "check_every": 3}, "use lead >= 4"),
        ({"lead": 4, "check_every": 2, "max_drift": 3}, "use lead >= 5"),
        ({"lead": 2, "check_every": 0}, "check_every >= 1"),
    ],
)
def test_lead_too_small_is_rejected_with_the_rule(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match="lead >= check_every \\+ max_drift") as info:
        EmergencyCheckpoint(Saves(), **kwargs)
    assert needle in str(info.value)


def test_default_check_period_is_the_most_the_lead_allows() -> None:
    with EmergencyCheckpoint(Saves(), lead=5) as ec:
        assert ec.check_every == 4
    with EmergencyCheckpoint(Saves(), lead=5, max_drift=2) as ec:
        assert ec.check_every == 3


def test_needs_a_manager_or_a_callable() -> None:
    with pytest.raises(TypeError, match="CheckpointManager or a save"):
        EmergencyCheckpoint(42)


def test_error_derives_from_the_package_base_error() -> None:
    assert issubclass(EmergencyCheckpointError, CheckpointError)


# --- signal handling -----------------------------------------------------------------------------
def test_handler_only_flags_and_close_restores_the_previous_one() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        ec = EmergencyCheckpoint(Saves(), signals=(signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ec.signal_received and seen == []  # replaced, not chained by default
        ec.close()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]  # the previous handler is back
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_replacing_a_handler_warns_and_chaining_calls_it(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        with caplog.at_level(logging.WARNING):
            ec = EmergencyCheckpoint(Saves(), signals=(signal.SIGUSR2,), chain_previous=True)
        assert "replaces the SIGUSR2 handler" in caplog.text
        os.kill(os.getpid(), signal.SIGUSR2)
        assert ec.signal_received and seen == [signal.SIGUSR2]
        ec.close()
    finally:
        signal.signal(signal.SIGUSR2, previous)


# --- one rank ---------------------------------------------------------------------------------
def test_single_rank_stops_at_once_and_exits_with_the_preempted_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(EXIT_INFO_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PREEMPTED_EXIT_CODE_ENV, "75")
    saves = Saves()
    ec = _ec(monkeypatch, 0, 1, save=saves, signals=(signal.SIGUSR1,))
    try:
        assert not ec.should_stop(1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ec.should_stop(2) and ec.stop_step == 2  # nobody to wait for: this step
        with pytest.raises(Exited) as info:
            ec.save_and_exit(2, {"w": 1})
    finally:
        ec.close()
    assert info.value.code == 75
    assert saves.calls == [(2, {"w": 1})]
    assert json.loads((tmp_path / "rank_0.json").read_text()) == {
        "reason": "preempted",
        "step": 2,
        "plan": "full",
    }


def test_without_a_launcher_the_exit_code_is_0(monkeypatch: pytest.MonkeyPatch) -> None:
    ec = _ec(monkeypatch, 0, 1, signals=(signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ec.should_stop(7)
        with pytest.raises(Exited) as info:
            ec.save_and_exit(7, {})
    finally:
        ec.close()
    assert info.value.code == 0


def test_a_failed_save_exits_1_and_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(EXIT_INFO_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PREEMPTED_EXIT_CODE_ENV, "75")
    ec = _ec(monkeypatch, 0, 1, save=Saves(fail=True), signals=(signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ec.should_stop(3)
        with pytest.raises(Exited) as info:
            ec.save_and_exit(3, {})
    finally:
        ec.close()
    assert info.value.code == 1
    data = json.loads((tmp_path / "rank_0.json").read_text())
    assert data["reason"] == "preempt_save_failed" and "No space left" in data["error"]


def test_save_and_exit_refuses_another_step(monkeypatch: pytest.MonkeyPatch) -> None:
    ec = _ec(monkeypatch, 0, 1, signals=(signal.SIGUSR1,))
    try:
        with pytest.raises(EmergencyCheckpointError, match="agreed stop step is None"):
            ec.save_and_exit(3, {})
    finally:
        ec.close()


# --- budget ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expected_s", "local", "plan"),
    [
        (0.1, False, "full"),
        (50.0, False, "essential"),
        (50.0, True, "local"),
        (None, False, "full"),
    ],
)
def test_budget_saves_what_fits(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    expected_s: float | None,
    local: bool,
    plan: str,
) -> None:
    monkeypatch.setenv(TERM_TIMEOUT_ENV, "10")
    full, local_saves = Saves(), Saves()
    ec = _ec(
        monkeypatch,
        0,
        1,
        save=full,
        signals=(signal.SIGUSR1,),
        local_save=local_saves if local else None,
    )
    try:
        assert ec.term_timeout_s == 10.0
        if expected_s is not None:
            ec.record_save(expected_s / 2)
            ec.record_save(expected_s)  # the longest recent save is expected
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ec.should_stop(4)
        with caplog.at_level(logging.WARNING), pytest.raises(Exited):
            ec.save_and_exit(4, {"model": 1, "optim": 2}, essential={"model": 1})
    finally:
        ec.close()
    assert f": {plan} save;" in caplog.text
    if plan == "full":
        assert full.calls == [(4, {"model": 1, "optim": 2})]
    elif plan == "essential":
        assert full.calls == [(4, {"model": 1})]
    else:
        assert local_saves.calls == [(4, {"model": 1, "optim": 2})] and not full.calls


# --- agreement between ranks (two ranks in one process, a shared HashStore) ---------------------
def test_every_rank_learns_the_stop_step_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 runs one step ahead (max_drift); rank 0 gets the signal; both stop at one step."""
    store = dist.HashStore()
    r0 = _ec(monkeypatch, 0, 2, store=store, signals=(signal.SIGUSR1,), lead=4)
    r1 = _ec(monkeypatch, 1, 2, store=store, signals=(signal.SIGUSR2,), lead=4)
    assert r0.check_every == r1.check_every == 3
    stops: dict[int, int] = {}
    try:
        for step in range(1, 40):
            # rank 1 is one step ahead of rank 0
            if 1 not in stops and r1.should_stop(step + 1):
                stops[1] = step + 1
            if step == 11:
                os.kill(os.getpid(), signal.SIGUSR1)
            if 0 not in stops and r0.should_stop(step):
                stops[0] = step
    finally:
        r0.close()
        r1.close()
    assert stops == {0: 15, 1: 15}  # noticed at 11, lead 4


def test_a_rank_past_the_stop_step_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    store = dist.HashStore()
    r1 = _ec(monkeypatch, 1, 2, store=store, signals=(signal.SIGUSR2,), lead=2)
    try:
        StopAgreement(store, 0, 2, "resiliency/emergency/").propose(
            StopRecord(step=5, rank=0, signal="SIGTERM", deadline=None)
        )
        with pytest.raises(EmergencyCheckpointError, match="past the agreed emergency stop"):
            r1.should_stop(6)  # this loop ran further ahead than max_drift allows
    finally:
        r1.close()


def test_first_proposal_and_first_plan_win() -> None:
    store = dist.HashStore()
    a = StopAgreement(store, 0, 2, "p/")
    b = StopAgreement(store, 1, 2, "p/")
    assert b.poll() is None
    first = a.propose(StopRecord(10, 0, "SIGTERM", 123.0))
    assert b.propose(StopRecord(11, 1, "SIGUSR1", None)) == first
    assert b.poll() == first
    assert a.agree_plan("essential") == "essential"
    assert b.agree_plan("full") == "essential"
    assert b.finish(1.0) and a.finish(1.0)


def test_a_store_error_reads_as_no_stop_yet(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("connection reset")

    agreement = StopAgreement(Broken(), 1, 2, "p/")
    with caplog.at_level(logging.WARNING):
        assert agreement.poll() is None
        assert agreement.poll() is None
    assert caplog.text.count("connection reset") == 1  # logged once
