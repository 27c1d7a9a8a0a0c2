"""A throw-away etcd with TLS (client certificates required) and authentication on.

Certificates come from ``openssl`` (EC P-256 keys: fast): a CA, a second CA that signs nothing
etcd trusts, the server's certificate for 127.0.0.1, and client certificates without a Common
Name (etcd's gRPC gateway refuses a client certificate with one) plus one with a CN to show that
refusal. Users and roles are made with ``etcdctl``, the same commands docs/supervisor.md gives.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

ETCDCTL = shutil.which("etcdctl")
OPENSSL = shutil.which("openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([str(OPENSSL), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", key.name, "-out", crt.name, "-days", "2", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    return crt, key


def _signed(directory: Path, name: str, subject: str, ca: tuple[Path, Path], ext: str) -> Path:
    (directory / f"{name}.ext").write_text(ext)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", ca[0].name, "-CAkey", ca[1].name,
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip
    return directory / f"{name}.crt"


@dataclass(frozen=True)
class Client:
    """A client certificate and its key."""

    cert: Path
    key: Path


class Pki:
    """The certificates of one test etcd."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True)
        self.dir = directory
        self.ca, ca_key = _ca(directory, "test-ca")
        self.other_ca, _ = _ca(directory, "other-ca")
        client_ext = "extendedKeyUsage=clientAuth\n"
        server_ext = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
        self.server = Client(
            _signed(directory, "server", "/CN=etcd-server", (self.ca, ca_key), server_ext),
            directory / "server.key",
        )
        self.clients = {
            name: Client(
                _signed(directory, name, f"/O=resiliency/OU={name}", (self.ca, ca_key), client_ext),
                directory / f"{name}.key",
            )
            for name in ("admin", "job-a", "job-b")
        }
        self.with_cn = Client(
            _signed(directory, "with-cn", "/CN=job-a", (self.ca, ca_key), client_ext),
            directory / "with-cn.key",
        )


class SecureEtcd:
    """A single-member etcd on loopback: https only, client certificates required, RBAC on.

    ``root`` (password in :attr:`root_password`) administers it; :meth:`add_job` makes a user
    whose only role is read and write on one job's prefix.
    """

    def __init__(
        self,
        directory: Path,
        etcd: str,
        free_port: Callable[[], int],
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.pki = Pki(directory / "pki")
        self.port = free_port()
        peer = free_port()
        self.log_path = directory / "etcd-tls.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        client_url = f"https://127.0.0.1:{self.port}"
        # fmt: off
        command = [
            etcd,
            "--data-dir", str(directory / "data"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--cert-file", str(self.pki.server.cert),
            "--key-file", str(self.pki.server.key),
            "--trusted-ca-file", str(self.pki.ca),
            "--client-cert-auth",
            "--log-level", "warn",
            *extra_args,
        ]
        # fmt: on
        self.proc = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.root_password = secrets.token_hex(8)
        self._auth = False
        try:
            self._wait_ready()
            # The documented bootstrap: a root user with the root role, then auth on.
            self.etcdctl("user", "add", "root", "--new-user-password", self.root_password)
            self.etcdctl("user", "grant-role", "root", "root")
            self.etcdctl("auth", "enable")
            self._auth = True
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
            done = self._etcdctl("endpoint", "health", check=False)
            if done.returncode == 0:
                return
            last = done.stderr
            time.sleep(0.2)
        raise RuntimeError(f"the TLS etcd did not answer within 30 s: {last[-1000:]}")

    def _etcdctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        admin = self.pki.clients["admin"]
        command = [
            str(ETCDCTL),
            f"--endpoints=https://127.0.0.1:{self.port}",
            f"--cacert={self.pki.ca}",
            f"--cert={admin.cert}",
            f"--key={admin.key}",
            "--dial-timeout=10s",
            "--command-timeout=20s",
            *args,
        ]
        env = {**os.environ, "ETCDCTL_API": "3"}
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=60, env=env
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr}")
        return done

    def etcdctl(self, *args: str) -> str:
        """Run etcdctl as root (before auth is on, no user is needed)."""
        user = ("--user", f"root:{self.root_password}") if self._auth else ()
        return self._etcdctl(*user, *args).stdout

    def add_job(self, job: str) -> tuple[str, str]:
        """Make the documented role and user of ``job``; return (user, password)."""
        user, role, password = f"resiliency-{job}", f"resiliency-{job}", secrets.token_hex(8)
        self.etcdctl("role", "add", role)
        prefix = f"resiliency/{job}/"
        self.etcdctl("role", "grant-permission", role, "readwrite", prefix, "--prefix=true")
        self.etcdctl("user", "add", user, "--new-user-password", password)
        self.etcdctl("user", "grant-role", user, role)
        return user, password

    def add_user_without_role(self) -> tuple[str, str]:
        """A user that exists and may log in, with no role at all."""
        user, password = f"nobody-{secrets.token_hex(3)}", secrets.token_hex(8)
        self.etcdctl("user", "add", user, "--new-user-password", password)
        return user, password

    def url(
        self, job: str, *, client: str | None = "job-a", user: str | None = None, **over: str
    ) -> str:
        """``etcd://...`` for ``job`` with this CA, ``client``'s certificate and ``user``."""
        query: dict[str, str] = {"cacert": str(self.pki.ca)}
        if client is not None:
            chosen = self.pki.clients[client]
            query.update(cert=str(chosen.cert), key=str(chosen.key))
        if user is not None:
            query["user"] = user
        query.update(over)
        query = {k: v for k, v in query.items() if v}
        return f"etcd://127.0.0.1:{self.port}/{job}?{urlencode(query)}"

    def root_url(self, job: str) -> str:
        """A URL with root's rights (to look at and forge keys of any job)."""
        return self.url(job, client="admin", user=f"root:{self.root_password}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()
