"""A throw-away single-member etcd on loopback, for the tests and the benchmarks that need a real
one (the ``etcd`` binary: Debian's etcd-server). Stopped by its pid (its own process group).

Standard library only. Where etcd is missing a test is skipped, unless ``etcd_required()``
(``RESILIENCY_REQUIRE_ETCD=1``, set by ``.ci/run``: CI must run them), then it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ETCD = shutil.which("etcd")
SKIP_ETCD = "the etcd binary is not installed (apt-get install etcd-server)"


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def etcd_required() -> bool:
    """Whether a test that needs etcd must fail, not skip, where it is missing (CI)."""
    return os.environ.get("RESILIENCY_REQUIRE_ETCD") == "1"


class EtcdServer:
    """``etcd`` in its own session, its data in ``data_dir`` (a new temporary one by default)."""

    def __init__(self, data_dir: Path | None = None, start_timeout: float = 30.0) -> None:
        if ETCD is None:
            raise RuntimeError(SKIP_ETCD)
        self._own_dir = data_dir is None
        data_dir = data_dir or Path(tempfile.mkdtemp(prefix="etcd-")) / "data"
        self._data_dir = data_dir
        self.port = free_port()
        peer = free_port()
        client, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        self.log_path = data_dir.parent / "etcd.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                *(ETCD, "--data-dir", str(data_dir), "--log-level", "warn"),
                *("--listen-client-urls", client, "--advertise-client-urls", client),
                *("--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url),
                *("--initial-cluster", f"default={peer_url}"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
            try:
                health = f"http://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(health, timeout=0.5) as answer:
                    if b'"true"' in answer.read():
                        return
            except OSError:  # not serving yet: ask again until the deadline
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not answer within {start_timeout:.0f} s; see {self.log_path}")

    def url(self, job: str = "default") -> str:
        """The supervisor backend URL of ``job`` on this etcd."""
        return f"etcd://127.0.0.1:{self.port}/{job}"

    def stop(self) -> None:
        """Kill etcd by its pid (its own process group); remove its data if it made the folder."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()
        if self._own_dir:
            shutil.rmtree(self._data_dir.parent, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
