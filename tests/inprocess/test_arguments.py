"""Config typos and bad arguments to the wrapper and its helpers are clear errors."""

from __future__ import annotations

import gc
import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from inprocess_harness import free_port_run

from resiliency import inprocess
from resiliency.inprocess.exception import ConfigError, RepeatedFaultError
from resiliency.inprocess.initialize import RetryController
from resiliency.inprocess.rank_assignment import ActiveWorldSizeDivisibleBy, MaxActiveWorldSize


def test_defaults_are_accepted() -> None:
    wrapper = inprocess.Wrapper()
    assert wrapper.timeouts["soft_timeout"] == 60
    assert wrapper.timeouts["hard_timeout"] == 90
    assert wrapper.timeouts["barrier_timeout"] == 120


def test_a_misspelt_argument_names_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown argument 'soft_timout'.*'soft_timeout'"):
        inprocess.Wrapper(soft_timout=timedelta(seconds=5))


def test_an_unrelated_unknown_argument_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown argument 'zzz'"):
        inprocess.Wrapper(zzz=1)


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("rank_filter", "rank_filter.RankFilter"),
        ("completion", "completion.Completion"),
        ("terminate", "terminate.Terminate"),
    ],
)
def test_nvrx_0_5_and_deprecated_callbacks_of_the_wrong_kind_name_their_class(
    name: str, base: str
) -> None:
    with pytest.raises(ConfigError, match=f"{name}=.*resiliency.inprocess.{base}"):
        inprocess.Wrapper(**{name: lambda state: state})


def test_rank_filter_is_accepted_with_nvrxs_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"rank_filter=.*deprecated.*rank_assignment"):
        wrapper = inprocess.Wrapper(
            rank_filter=inprocess.Compose(
                inprocess.rank_filter.MaxActiveWorldSize(3),
                inprocess.rank_filter.WorldSizeDivisibleBy(2),
            )
        )
    assert isinstance(wrapper.rank_filter, inprocess.rank_filter.RankFilter)
    with pytest.raises(ConfigError, match=r"MaxActiveWorldSize\(0\)"):
        inprocess.rank_filter.MaxActiveWorldSize(0)


def test_a_number_instead_of_a_timedelta_shows_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"soft_timeout=5\).*timedelta\(seconds=5\)"):
        inprocess.Wrapper(soft_timeout=5)


def test_timeouts_out_of_order_name_both() -> None:
    with pytest.raises(ConfigError, match=r"soft_timeout .* must be shorter than hard_timeout"):
        inprocess.Wrapper(soft_timeout=timedelta(seconds=100))
    with pytest.raises(ConfigError, match=r"heartbeat_interval .* shorter than heartbeat_timeout"):
        inprocess.Wrapper(heartbeat_interval=timedelta(seconds=40))


def test_negative_timeout_is_an_error() -> None:
    with pytest.raises(ConfigError, match="must not be negative"):
        inprocess.Wrapper(last_call_wait=timedelta(seconds=-1))


def test_a_callback_of_the_wrong_kind_names_the_expected_class() -> None:
    with pytest.raises(ConfigError, match=r"abort=.*resiliency.inprocess.abort.Abort"):
        inprocess.Wrapper(abort=lambda state: state)
    with pytest.raises(ConfigError, match=r"health_check=.*health_check.HealthCheck"):
        inprocess.Wrapper(health_check=RetryController())


def test_a_composed_callback_is_of_its_parts_kind() -> None:
    composed = inprocess.Compose(
        inprocess.health_check.FaultCounter(), inprocess.health_check.CudaHealthCheck()
    )
    assert isinstance(composed, inprocess.health_check.HealthCheck)
    inprocess.Wrapper(health_check=composed)


def test_store_kwargs_typo_names_the_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'prot'.*did you mean 'port'"):
        inprocess.Wrapper(store_kwargs={"prot": 1234})


def test_enabled_false_returns_the_function_itself() -> None:
    def train() -> int:
        return 3

    assert inprocess.Wrapper(enabled=False)(train) is train


def test_missing_rank_variables_are_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    wrapped = inprocess.Wrapper()(lambda: None)
    with pytest.raises(ConfigError, match=r"needs RANK and WORLD_SIZE.*torchrun"):
        wrapped()


def test_rank_assignment_helpers_reject_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="max_active_world_size=0"):
        MaxActiveWorldSize(0)
    with pytest.raises(ConfigError, match="divisor=0"):
        ActiveWorldSizeDivisibleBy(0)


def test_compose_rejects_what_is_not_callable() -> None:
    with pytest.raises(ConfigError, match="not callable"):
        inprocess.Compose(inprocess.health_check.FaultCounter(), 3)


def test_the_repeated_fault_limit_defaults_to_three_and_can_be_turned_off() -> None:
    assert inprocess.Wrapper().max_repeated_faults == 3
    assert inprocess.Wrapper(max_repeated_faults="auto").max_repeated_faults == 3
    assert inprocess.Wrapper(max_repeated_faults=None).max_repeated_faults is None
    for bad in (-1, 2.5, "3", True):
        with pytest.raises(ConfigError, match=r"max_repeated_faults=.*whole number"):
            inprocess.Wrapper(max_repeated_faults=bad)


def test_a_retry_controller_bounding_the_iterations_turns_the_default_limit_off() -> None:
    retry = inprocess.initialize.RetryController
    # The user's own bound governs, as in NVRx (its tests retry a raising function 4 times).
    assert inprocess.Wrapper(initialize=retry(max_iterations=4)).max_repeated_faults is None
    nested = inprocess.Compose(retry(min_world_size=1), retry(max_iterations=9))
    assert inprocess.Wrapper(initialize=nested).max_repeated_faults is None
    alone = inprocess.Compose(retry(max_iterations=2))  # itself a RetryController
    assert inprocess.Wrapper(initialize=alone).max_repeated_faults is None
    # No bound on the iterations: the default protects the job from restarting forever.
    assert inprocess.Wrapper(initialize=retry(min_world_size=2)).max_repeated_faults == 3
    # A number asked for applies beside the bound.
    bounded = inprocess.Wrapper(initialize=retry(max_iterations=4), max_repeated_faults=2)
    assert bounded.max_repeated_faults == 2


class _LeavesTheModeAlone(inprocess.rank_assignment.RankAssignment):
    def __call__(
        self, ctx: inprocess.rank_assignment.RankAssignmentCtx
    ) -> inprocess.rank_assignment.RankAssignmentCtx:
        return ctx


def test_a_rank_assignment_that_gives_no_mode_is_a_fault_of_the_iteration_not_a_wait(
    one_rank: dist.HashStore,
) -> None:
    store = one_rank
    calls = []

    @inprocess.Wrapper(store_factory=lambda: store, rank_assignment=_LeavesTheModeAlone())
    def train() -> None:
        calls.append(1)

    # As in NVRx, each iteration raises InternalError (restarted like any fault); the same one
    # every time, so the stop rule ends it, instead of a wait for completion_timeout.
    with pytest.raises(RepeatedFaultError, match=r"UnassignedRankError.*INITIALIZED") as caught:
        train()
    assert calls == []
    assert "rank 0: the rank assignment left it in mode INITIALIZED" in str(caught.value)


def test_an_internal_error_of_the_first_assignment_restarts_and_the_next_error_stops_it(
    one_rank: dist.HashStore,
) -> None:
    store = one_rank

    class FirstLeavesItThenFails(_LeavesTheModeAlone):
        calls = 0

        def __call__(
            self, ctx: inprocess.rank_assignment.RankAssignmentCtx
        ) -> inprocess.rank_assignment.RankAssignmentCtx:
            self.calls += 1
            if self.calls > 1:
                raise ZeroDivisionError("the second assignment")
            return ctx

    @inprocess.Wrapper(store_factory=lambda: store, rank_assignment=FirstLeavesItThenFails())
    def train() -> None:
        raise AssertionError("never called")

    with pytest.raises(ZeroDivisionError, match="the second assignment"):
        train()


def test_the_wrapped_function_can_be_called_again_on_the_same_port(
    one_rank: dist.HashStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port_run()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))

    @inprocess.Wrapper()
    def train(x: int) -> int:
        return x + 1

    gc.disable()  # the store must be freed by the call's end, not by a later GC pass
    try:
        assert train(1) == 2
        with socket.socket() as probe:  # rank 0's store released MASTER_PORT + 1 at once
            probe.bind(("127.0.0.1", port + 1))
        assert train(2) == 3
    finally:
        gc.enable()


def test_the_monitor_process_pid_is_written_where_nvrxs_pidfile_says(
    one_rank: dist.HashStore, tmp_path: Path
) -> None:
    store = one_rank
    pids: list[int] = []

    @inprocess.Wrapper(
        store_factory=lambda: store, monitor_process_pidfile=f"{tmp_path}/mp_{{rank}}"
    )
    def train() -> None:
        pids.append(int((tmp_path / "mp_0").read_text()))
        assert Path(f"/proc/{pids[0]}/cmdline").read_bytes().count(b"_monitor_process_main") == 1

    train()
    assert pids and pids[0] not in (0, os.getpid())

    @inprocess.Wrapper(store_factory=lambda: store, monitor_process_pidfile=f"{tmp_path}/no/pid")
    def unwritable() -> None:
        raise AssertionError("not called: the pid file could not be written")

    with pytest.raises(ConfigError, match=r"cannot write the monitor process's pid to '.*/no/pid'"):
        unwritable()
    with pytest.raises(ConfigError, match=r"monitor_process_pidfile=3\): expected a str"):
        inprocess.Wrapper(monitor_process_pidfile=3)
