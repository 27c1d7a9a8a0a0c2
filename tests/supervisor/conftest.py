"""Fixtures of the supervisor tests: a real TCPStore, a real etcd, a real etcd with TLS and
authentication on (skipped without the binaries), all three behind one parametrized
``backend_url`` fixture. Every process is cleaned up by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from secure_etcd import ETCD, ETCDCTL, OPENSSL, SecureEtcd, free_port

from resiliency.supervisor import Backend, backend_from_url

SKIP_ETCD = "the etcd binary is not installed (apt-get install etcd-server)"
SKIP_TLS = "the TLS etcd needs etcdctl and openssl (apt-get install etcd-client openssl)"


class EtcdServer:
    """A throw-away single-member etcd on loopback."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        peer = free_port()
        self.log_path = data_dir.parent / "etcd.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                str(ETCD),
                "--data-dir",
                str(data_dir),
                "--listen-client-urls",
                f"http://127.0.0.1:{self.port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--log-level",
                "warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                backend_from_url(self.url()).close()
                return
            except Exception:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("etcd did not answer within 30 s")

    def url(self, job: str = "default") -> str:
        return f"etcd://127.0.0.1:{self.port}/{job}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    _require(ETCD is None, SKIP_ETCD)
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    yield server
    server.stop()


def _require(missing: bool, reason: str) -> None:
    if not missing:
        return
    if os.environ.get("RESILIENCY_REQUIRE_ETCD") == "1":  # set by .ci/run: CI must run them
        pytest.fail(reason + ", but RESILIENCY_REQUIRE_ETCD=1")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    """etcd over https only, client certificates required, authentication (RBAC) on."""
    _require(ETCD is None, SKIP_ETCD)
    _require(ETCDCTL is None or OPENSSL is None, SKIP_TLS)
    server = SecureEtcd(tmp_path_factory.mktemp("etcd-tls"), str(ETCD), free_port)
    yield server
    server.stop()


@pytest.fixture
def tcp_server() -> Iterator[Backend]:
    """A TCPStore hosted by the test process (on a free port)."""
    backend = backend_from_url(f"tcp://127.0.0.1:0/job-{os.getpid()}", server=True)
    yield backend
    backend.close()


_JOBS = iter(range(1_000_000))


@pytest.fixture(params=["tcp", "etcd", "etcd-tls"])
def backend_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh job namespace on each real backend; on ``etcd-tls`` with a client certificate
    and a user whose only role is the job's prefix."""
    job = f"t{os.getpid()}-{next(_JOBS)}"
    if request.param == "tcp":
        host = request.getfixturevalue("tcp_server")
        yield f"tcp://127.0.0.1:{host.port}/{job}"
    elif request.param == "etcd":
        server = request.getfixturevalue("etcd_server")
        yield server.url(job)
    else:
        secure: SecureEtcd = request.getfixturevalue("secure_etcd")
        user, password = secure.add_job(job)
        yield secure.url(job, user=f"{user}:{password}")


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the fake ``pynvml`` on sys.path; its state file is returned (JSON, see the module)."""
    state = tmp_path / "nvml.json"
    state.write_text('{"count": 1}')
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "fake_nvml"))
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    sys.modules.pop("pynvml", None)
    yield state
    sys.modules.pop("pynvml", None)
