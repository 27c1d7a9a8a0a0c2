"""``resiliency-host-daemon``: GPU health from a process that outlives the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from resiliency.supervisor import (
    Controller,
    GpuHealthPolicy,
    NodeSensor,
    NodeStatus,
    backend_from_url,
    keys_for,
)

FAKE_NVML = Path(__file__).parents[1] / "fake_nvml"  # the one fake pynvml of the tests


def test_host_daemon_gpu_fault_excludes_the_node_of_that_host(backend_url: str, tmp_path: Path):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"count": 2, "xid": {"1": [79]}}))
    env = dict(os.environ, FAKE_NVML_STATE=str(state), PYTHONPATH=str(FAKE_NVML))
    # Its output goes to a file: a pipe nobody read could fill and block it, and was left
    # unclosed (a ResourceWarning, an error under filterwarnings = error).
    log = (tmp_path / "host_daemon.log").open("wb")
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resiliency.supervisor.host_daemon",
            backend_url,
            "--node",
            "n1",
            "--interval",
            "0.5",
        ],
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()  # the daemon has its own descriptor
    try:
        backend = backend_from_url(backend_url)
        key = keys_for(backend.namespace).host("n1")
        deadline = time.monotonic() + 60
        while backend.get(key) is None:
            assert time.monotonic() < deadline, "the host daemon published nothing"
            time.sleep(0.2)
        doc = NodeStatus.from_json(backend.get(key))
        assert doc.state == "host" and doc.gpu[1].xid == [79]
        # The node's launcher (here its sensor) runs; the host daemon's document excludes it.
        launcher = NodeSensor(
            backend, "n1", lambda: {"state": "running"}, interval=0.5, gpu=False, ledger_dir=""
        )
        launcher.publish_once()
        # No wait for a fresher host sample: a new controller has seen none, so the one above
        # counts as new on its first cycle.
        controller = Controller(backend, [GpuHealthPolicy()], recorder=object())
        (decision,) = controller.cycle().decisions
        assert (decision.node, decision.action) == ("n1", "exclude")
        assert "XID [79]" in decision.reason
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(90) == 0  # its sensor thread ends within interval + 15 s
        backend.close()
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(10)
