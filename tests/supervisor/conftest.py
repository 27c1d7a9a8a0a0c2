"""Fixtures of the supervisor tests: a real TCPStore, a real etcd, a real etcd with TLS and
authentication on (skipped without the binaries), all three behind one parametrized
``backend_url`` fixture. Every process is cleaned up by pid."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_server import ETCD, SKIP_ETCD, EtcdServer, etcd_required, free_port
from secure_etcd import ETCDCTL, OPENSSL, SecureEtcd

from resiliency.supervisor import Backend, backend_from_url

SKIP_TLS = "the TLS etcd needs etcdctl and openssl (apt-get install etcd-client openssl)"


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    _require(ETCD is None, SKIP_ETCD)
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    yield server
    server.stop()


def _require(missing: bool, reason: str) -> None:
    if not missing:
        return
    if etcd_required():
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
