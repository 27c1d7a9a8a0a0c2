"""``ft_launcher`` as a user of NVIDIA's resiliency extension (NVRx) 0.4.1 or of torchrun runs it.

Written from NVRx's documented launcher behaviour (``--fault-tol-cfg-path``/``--ft-cfg-path``,
``--ft-param-<snake_name>`` flags, an empty config file with flags, the initial-heartbeat timeout
counted from ``init_workload_monitoring()``, exit 0 on success and 1 on failure, including a
SIGTERM to the launcher that ended workers which did not all exit 0) and torchrun's.

Needs ft-core, ft-launcher and torch: runs in the ``ft_launcher`` nox session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    mode = os.environ["COMPAT_MODE"]
    marker = os.environ["COMPAT_MARKERS"]
    rank = os.environ["RANK"]
    if mode == "slow_connect_no_heartbeat":
        time.sleep(4.0)  # "imports" longer than the initial-heartbeat timeout
    from resiliency.ft import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()
    if mode in ("heartbeat", "slow_connect_no_heartbeat"):
        if mode == "heartbeat":
            client.send_heartbeat()
        client.shutdown_workload_monitoring()
        sys.exit(0)
    if mode == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def stop(*_):
            client.shutdown_workload_monitoring()
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
    open(os.path.join(marker, f"ready-{rank}"), "w").close()
    while True:
        client.send_heartbeat()
        time.sleep(0.1)
    """
)

FLAGS = ["--monitor-interval", "0.1", "--ft-workload-check-interval", "0.2"]


class Run:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, markers: Path) -> None:
        self.proc, self.log_path, self.markers = proc, log, markers

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 90.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"ft_launcher still runs after {timeout} s:\n{self.log()}"
            ) from None

    def wait_ready(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(list(self.markers.glob("ready-*"))) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"workers not ready:\n{self.log()}")
            time.sleep(0.05)


@pytest.fixture
def ft_launcher(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []
    script = tmp_path / "train.py"
    script.write_text(WORKER)

    def run(*args: str, mode: str = "heartbeat", nproc: int = 1) -> Run:
        markers = tmp_path / f"markers-{len(runs)}"
        markers.mkdir()
        log = tmp_path / f"launcher-{len(runs)}.log"
        env = {**os.environ, "COMPAT_MODE": mode, "COMPAT_MARKERS": str(markers)}
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "resiliency.launcher",
                    "--nproc-per-node",
                    str(nproc),
                    *FLAGS,
                    *args,
                    str(script),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
                start_new_session=True,
            )
        runs.append(Run(proc, log, markers))
        return runs[-1]

    yield run
    for r in runs:
        if r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait(10)


def test_ft_param_flags(ft_launcher):
    run = ft_launcher("--ft-param-rank_heartbeat_timeout", "30", "--ft-param-safety_factor", "2")
    assert run.wait() == 0, run.log()


def test_nvrx_only_flags_are_accepted_with_a_warning(ft_launcher):
    run = ft_launcher(
        "--ft-param-restart_check_interval",
        "5",
        "--ft-enable-nic-monitor",
        "true",
        "--ft-param-skip_section_response",
        "false",
    )
    assert run.wait() == 0, run.log()
    log = run.log()
    for key in ("restart_check_interval", "enable_nic_monitor", "skip_section_response"):
        assert f"setting '{key}'" in log and "no effect here" in log


def test_empty_config_file_with_flags(ft_launcher, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    run = ft_launcher("--ft-cfg-path", str(empty), "--ft-param-rank_heartbeat_timeout", "30")
    assert run.wait() == 0, run.log()


def test_missing_config_file_is_an_error(ft_launcher, tmp_path):
    run = ft_launcher("--fault-tol-cfg-path", str(tmp_path / "missing.yaml"))
    assert run.wait() != 0
    assert "does not exist" in run.log()


def test_file_without_section_is_an_error_even_with_flags(ft_launcher, tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("trainer:\n  max_steps: 10\n")
    run = ft_launcher("--ft-cfg-path", str(other), "--ft-param-rank_heartbeat_timeout", "30")
    assert run.wait() != 0
    assert "has no 'fault_tolerance' section" in run.log()


def test_unknown_flag_names_the_closest(ft_launcher):
    run = ft_launcher("--ft-param-rank_heartbeat_timout", "30")
    assert run.wait() != 0
    assert "did you mean" in run.log()


def test_sigusr2_as_rank_termination_signal(ft_launcher):
    run = ft_launcher("--ft-rank-termination-signal", "SIGUSR2")
    assert run.wait() == 0, run.log()
    assert "the stack dump uses SIGUSR1 instead" in run.log()


def test_initial_heartbeat_timeout_counts_from_init_workload_monitoring(ft_launcher):
    # Issue 10's failure mode: ranks whose imports outlast the initial-heartbeat timeout, then
    # connect and exit 0 without a heartbeat. Not a hang: the job succeeds.
    run = ft_launcher(
        "--ft-param-initial_rank_heartbeat_timeout",
        "3",
        "--max-restarts",
        "0",
        mode="slow_connect_no_heartbeat",
        nproc=2,
    )
    assert run.wait() == 0, run.log()
    assert "hangs detected: 0" in run.log()
    assert "[timer: initial]" not in run.log()


def test_sigterm_with_workers_exiting_0_exits_0(ft_launcher):
    run = ft_launcher("--term-timeout", "20", mode="exit_on_sigterm", nproc=2)
    run.wait_ready(2)
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait() == 0, run.log()


def test_sigterm_with_workers_ignoring_it_exits_1_after_term_timeout(ft_launcher):
    run = ft_launcher("--term-timeout", "1", mode="ignore_sigterm", nproc=2)
    run.wait_ready(2)
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait() == 1, run.log()
