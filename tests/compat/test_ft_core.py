"""What a user of NVIDIA's resiliency extension (NVRx) 0.4.1 types for fault tolerance, after
changing only the import line (``nvidia_resiliency_ext.fault_tolerance`` -> ``resiliency.ft``).

Written from NVRx's public documentation and signatures (API reference of ``FaultToleranceConfig``,
``RankMonitorClient``, ``RankMonitorClientError``, ``WorkloadAction``, ``WorkloadControlRequest``,
``HeartbeatTimeouts``, ``SectionTimeouts``). Where this toolkit deliberately differs, the test
asserts the documented difference (docs/coming_from_nvidia_resiliency_ext.md).

Needs ft-core only (no torch): runs in the ``ft_core`` nox session.
"""

from __future__ import annotations

import logging
import shutil
import signal
import time

import pytest
import yaml

from resiliency.ft import (
    FaultToleranceConfig,
    HeartbeatTimeouts,
    MonitorProcess,
    RankMonitorClient,
    RankMonitorClientError,
    SectionTimeouts,
    WorkloadAction,
    WorkloadControlRequest,
    create_socket_dir,
)

# -- FaultToleranceConfig -------------------------------------------------------------------------


def test_defaults_match_nvrx_0_4_1_except_the_termination_signal():
    cfg = FaultToleranceConfig()
    assert cfg.workload_check_interval == 5.0
    assert cfg.initial_rank_heartbeat_timeout == 3600.0
    assert cfg.rank_heartbeat_timeout == 2700.0
    assert cfg.rank_section_timeouts == {}
    assert cfg.rank_out_of_section_timeout is None
    assert cfg.node_health_check_interval == 5.0
    assert cfg.safety_factor == 5.0
    assert cfg.log_level == logging.INFO
    # Deliberate difference (documented): SIGTERM first, SIGKILL after a grace period.
    assert cfg.rank_termination_signal == signal.SIGTERM


def test_from_kwargs_builds_a_config():
    cfg = FaultToleranceConfig.from_kwargs(
        rank_heartbeat_timeout=60.0,
        rank_section_timeouts={"step": 30.0, "checkpointing": None},
        rank_termination_signal="SIGKILL",
        log_level="DEBUG",
    )
    assert cfg.rank_heartbeat_timeout == 60.0
    assert cfg.rank_section_timeouts == {"step": 30.0, "checkpointing": None}
    assert cfg.rank_termination_signal == signal.SIGKILL
    assert cfg.log_level == logging.DEBUG


def test_from_kwargs_not_ignoring_unknown_keys_raises_value_error():
    with pytest.raises(ValueError, match="rank_heartbeat_timout"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, rank_heartbeat_timout=5)


def test_from_kwargs_ignoring_unknown_keys_drops_them_loudly(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = FaultToleranceConfig.from_kwargs(ignore_not_recognized=True, colour="blue")
    assert cfg == FaultToleranceConfig()
    assert "colour" in caplog.text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("restart_check_interval", 60.0),
        ("enable_nic_monitor", True),
        ("pci_topo_file", "/tmp/topo.xml"),
        ("link_down_path_template", "/sys/{dev_name}"),
        ("skip_section_response", False),
        ("enable_rank_monitors", True),
        ("use_infra_group_rank", True),
    ],
)
def test_nvrx_keys_without_a_feature_here_are_accepted_with_a_warning(
    key, value, caplog, monkeypatch
):
    # The warning comes once per process and key: forget earlier tests' warnings.
    monkeypatch.setattr("resiliency.ft._nvrx_keys._warned", set())
    with caplog.at_level(logging.WARNING):
        cfg = FaultToleranceConfig.from_kwargs(**{key: value, "safety_factor": 2.0})
        FaultToleranceConfig(**{key: value})
    assert cfg.safety_factor == 2.0
    assert key in caplog.text and "no effect" in caplog.text


def test_a_key_no_version_has_is_still_an_error_with_a_hint():
    with pytest.raises(ValueError, match="did you mean 'safety_factor'"):
        FaultToleranceConfig(safety_facter=2.0)


def test_from_yaml_file_nested_section(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "fault_tolerance": {
                        "initial_rank_heartbeat_timeout": 120,
                        "rank_heartbeat_timeout": 30,
                        "restart_check_interval": 10,
                    }
                }
            }
        )
    )
    cfg = FaultToleranceConfig.from_yaml_file(str(path))
    assert cfg.initial_rank_heartbeat_timeout == 120.0
    assert cfg.rank_heartbeat_timeout == 30.0


def test_from_yaml_file_ignore_not_recognized(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 30\n  colour: blue\n")
    cfg = FaultToleranceConfig.from_yaml_file(str(path), ignore_not_recognized=True)
    assert cfg.rank_heartbeat_timeout == 30.0
    # Deliberate difference: the default is False here (NVRx: True, silently).
    with pytest.raises(ValueError, match="colour"):
        FaultToleranceConfig.from_yaml_file(str(path))


def test_from_yaml_file_without_section_raises_value_error(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("trainer:\n  max_steps: 10\n")
    with pytest.raises(ValueError, match="fault_tolerance"):
        FaultToleranceConfig.from_yaml_file(str(path))


def test_to_yaml_file_round_trip(tmp_path):
    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 10.0}, rank_heartbeat_timeout=None)
    path = tmp_path / "out.yaml"
    cfg.to_yaml_file(str(path))
    assert "fault_tolerance" in yaml.safe_load(path.read_text())
    assert FaultToleranceConfig.from_yaml_file(str(path)) == cfg


def test_sigusr2_as_termination_signal_works():
    cfg = FaultToleranceConfig(rank_termination_signal=signal.SIGUSR2)
    assert cfg.rank_termination_signal == signal.SIGUSR2
    assert cfg.stack_dump_signal != signal.SIGUSR2


def test_safety_factor_below_one_is_a_deliberate_error():
    with pytest.raises(ValueError, match="safety_factor"):
        FaultToleranceConfig(safety_factor=0.5)


# -- timeouts objects and workload control ------------------------------------------------------


def test_heartbeat_timeouts_are_valid():
    assert HeartbeatTimeouts(initial=10.0, subsequent=5.0, were_calculated=True).are_valid
    assert not HeartbeatTimeouts(initial=None, subsequent=5.0).are_valid
    assert not HeartbeatTimeouts().are_valid


def test_section_timeouts_are_valid_and_were_calculated():
    both = SectionTimeouts(section={"step": 1.0}, out_of_section=2.0)
    assert both.are_valid
    assert not SectionTimeouts(section={"step": None}, out_of_section=2.0).are_valid
    assert not SectionTimeouts(section={"step": 1.0}, out_of_section=None).are_valid
    calculated = SectionTimeouts(
        section={"step": 1.0},
        out_of_section=2.0,
        calculated_sections={"step"},
        is_out_of_section_calculated=True,
    )
    assert calculated.were_calculated and not both.were_calculated


def test_workload_actions_by_name_and_by_nvrx_number():
    assert WorkloadAction.Continue is WorkloadAction(0)
    assert WorkloadAction.ExcludeThisNode is WorkloadAction(1)
    assert WorkloadAction.ShutdownWorkload is WorkloadAction(2)
    req = WorkloadControlRequest(WorkloadAction.ShutdownWorkload, "bad node")
    assert req.action is WorkloadAction.ShutdownWorkload and req.description == "bad node"
    assert WorkloadControlRequest(2).action is WorkloadAction.ShutdownWorkload


# -- RankMonitorClient ----------------------------------------------------------------------------


def test_client_before_init(monkeypatch):
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    client = RankMonitorClient()
    assert client.hb_timeouts is None
    assert client.section_timeouts is None
    assert client.cfg is None
    assert not client.is_initialized
    with pytest.raises(RankMonitorClientError):
        client.init_workload_monitoring()
    assert issubclass(RankMonitorClientError, Exception)


@pytest.fixture
def monitor(tmp_path, monkeypatch):
    directory = create_socket_dir("compat-")
    cfg = FaultToleranceConfig(
        initial_rank_heartbeat_timeout=600.0,
        rank_heartbeat_timeout=600.0,
        rank_section_timeouts={"step": 600.0},
        workload_check_interval=1.0,
    )
    with open(tmp_path / "monitor.log", "wb") as log:
        proc = MonitorProcess.start(cfg, directory / "rank-0.sock", 0, stderr=log, start_timeout=60)
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", str(proc.socket_path))
    monkeypatch.setenv("RANK", "0")
    yield proc
    proc.stop(timeout=5.0)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
def test_client_session_as_in_nvrx(monitor):
    client = RankMonitorClient()
    client.init_workload_monitoring()
    try:
        assert client.is_initialized
        assert client.cfg is not None and client.cfg.rank_section_timeouts == {"step": 600.0}
        assert client.hb_timeouts is not None and client.hb_timeouts.are_valid
        assert not client.hb_timeouts.were_calculated
        assert client.section_timeouts is not None
        # Not enough data yet: False (here also without skip_if_not_ready, documented).
        assert client.calculate_and_set_hb_timeouts(skip_if_not_ready=True) is False
        assert client.calculate_and_set_section_timeouts(skip_if_not_ready=True) is False
        for _ in range(3):
            client.send_heartbeat()
            client.start_section("step")
            time.sleep(0.01)
            client.end_section("step")
        client.end_all_sections()
        # No wait for the monitor to read the heartbeats: the request below travels on the same
        # ordered socket, behind them, so the monitor has seen them when it answers.
        assert client.calculate_and_set_hb_timeouts(skip_if_not_ready=True) is True
        assert client.hb_timeouts.were_calculated
        assert client.calculate_and_set_section_timeouts(
            selected_sections=["step"], calc_out_of_section=False, skip_if_not_ready=True
        )
        state = client.state_dict()
        assert set(state) == {RankMonitorClient.CURRENT_TIMEOUTS_STATE_KEY}
        assert state["current_timeouts"]["heartbeat"]["were_calculated"] is True
        client.send_workload_control_request(
            WorkloadControlRequest(WorkloadAction.Continue, "nothing to do")
        )
    finally:
        client.shutdown_workload_monitoring()
    assert not client.is_initialized
