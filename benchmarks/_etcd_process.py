"""A throw-away single-member etcd on loopback for a benchmark, stopped by pid at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EtcdProcess:
    """``etcd`` (from PATH) in its own session, with its data in a temporary directory."""

    def __init__(self, start_timeout: float = 30.0) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise SystemExit("the etcd binary is not installed (apt-get install etcd-server)")
        self._dir = Path(tempfile.mkdtemp(prefix="bench-etcd-"))
        self.port, peer = _free_port(), _free_port()
        client, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        self._log = open(self._dir / "etcd.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                *(binary, "--data-dir", str(self._dir / "data"), "--log-level", "warn"),
                *("--listen-client-urls", client, "--advertise-client-urls", client),
                *("--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url),
                *("--initial-cluster", f"default={peer_url}"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"etcd did not start; see {self._dir / 'etcd.log'}") from None
                time.sleep(0.1)

    def url(self, job: str) -> str:
        """The supervisor backend URL of ``job`` on this etcd."""
        return f"etcd://127.0.0.1:{self.port}/{job}"

    def stop(self) -> None:
        """Kill etcd by its pid (its own process group) and remove its data."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
