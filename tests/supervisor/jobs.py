"""Run real ft-launchers on loopback as nodes, and a real controller, for the supervisor tests.

Every process is started in its own session and killed by pid (process group) at teardown.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ft_launcher"))

from launcher_harness import FAST_FT_FLAGS, REPO, Launcher, free_port, kill_leftovers

from resiliency.supervisor.cli import main as supervisor_main

TRAIN = Path(__file__).parent / "workers" / "train.py"
FAKE_NVML = Path(__file__).parents[1] / "fake_nvml"  # the one fake pynvml of the tests
INTERVAL = 0.5  # sensor and controller interval in these tests

POLICY = """\
interval: 0.5
policies:
  straggler: {threshold: 0.7, consecutive: 3}
  gpu_health: {}
  diagnosis: {exclude_classes: [gpu_hardware]}
  node_lost: {restart_survivors: true}
"""


class Controller:
    """``resiliency-supervisor controller`` as a subprocess."""

    def __init__(self, url: str, tmp: Path, goodput_dir: Path) -> None:
        policy = tmp / "policy.yaml"
        policy.write_text(POLICY)
        self.log_path = tmp / "controller.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "resiliency.supervisor",
                "controller",
                url,
                "--policy",
                str(policy),
                "--goodput-dir",
                str(goodput_dir),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if match := re.search(pattern, self.log()):
                return match
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} not in the controller log:\n{self.log()[-6000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


class Job:
    """Launchers of one job (c10d rendezvous on loopback), a controller, and their cleanup."""

    def __init__(self, tmp: Path, nnodes: str, backend: str, steps: int = 100_000) -> None:
        self.tmp = tmp
        self.markers = tmp / "markers"
        self.markers.mkdir()
        self.goodput = tmp / "goodput"
        self.goodput.mkdir()
        self.rdzv_port = free_port()
        self.job = f"job-{self.rdzv_port}"
        # tcp: the job's own rendezvous TCPStore (hosted by the first launcher).
        self.url = backend if backend.startswith("etcd") else f"tcp://127.0.0.1:{self.rdzv_port}"
        self.url += "/" + self.job if not backend.startswith("etcd") else ""
        self.nnodes = nnodes
        self.steps = steps
        self.launchers: dict[str, Launcher] = {}
        self.controller: Controller | None = None

    def start_node(
        self,
        node: str,
        *,
        slow: bool = False,
        ecc: bool = False,
        worker_args: tuple = (),
        launcher_args: tuple = (),
    ) -> Launcher:
        env = {"RESILIENCY_GOODPUT_DIR": str(self.goodput), "SUPERVISOR_TEST_SLOW": str(int(slow))}
        if ecc:
            state = self.tmp / f"nvml-{node}.json"
            state.write_text(json.dumps({"count": 1, "ecc": {"0": 2}}))
            env["FAKE_NVML_STATE"] = str(state)
            env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")])
        args = [
            "--nnodes",
            self.nnodes,
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{self.rdzv_port}",
            "--rdzv-id",
            self.job,
            "--rdzv-conf",
            "join_timeout=90,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2",
            "--local-addr",
            "127.0.0.1",
            "--max-restarts",
            "8",
            "--restart-policy",
            "min-healthy",
            *FAST_FT_FLAGS,
            *launcher_args,
            "--supervisor",
            self.url,
            "--supervisor-interval",
            str(INTERVAL),
            "--node-id",
            node,
            "--status-port",
            "0",
            str(TRAIN),
            "--marker-dir",
            str(self.markers),
            "--steps",
            str(self.steps),
            "--step-s",
            "0.05",
            *worker_args,
        ]
        launcher = Launcher(args, self.tmp / f"node-{node}.log", env=env)
        self.launchers[node] = launcher
        if len(self.launchers) == 1:
            # The first node hosts the rendezvous store (and so the tcp:// backend).
            launcher.wait_for_log("worker(s) on this node", 60)
        return launcher

    def start_controller(self) -> Controller:
        self.controller = Controller(self.url, self.tmp, self.goodput)
        return self.controller

    def status_port(self, node: str) -> int:
        launcher = self.launchers[node]
        launcher.wait_for_log("status endpoint: http://", 60)
        match = re.search(r"status endpoint: http://127\.0\.0\.1:(\d+)/metrics", launcher.log())
        assert match is not None
        return int(match.group(1))

    def decisions(self) -> list[dict]:
        """The supervisor_decision events of the goodput ledger."""
        out = []
        for path in self.goodput.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event.get("event") == "supervisor_decision":
                    out.append(event)
        return out

    def finish(self) -> None:
        """End training: every worker stops at its next step."""
        (self.markers / "finish").touch()

    def progress(self, rank: int) -> int:
        path = self.markers / f"progress-{rank}"
        return int(path.read_text() or 0) if path.exists() else 0

    def cleanup(self) -> None:
        for launcher in self.launchers.values():
            launcher.kill()
        if self.controller is not None:
            self.controller.kill()
        kill_leftovers(self.markers)


def status_table(url: str) -> str:
    """``resiliency-supervisor status URL`` (run in this process: no torch import per call)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert supervisor_main(["status", url]) == 0
    return out.getvalue()
