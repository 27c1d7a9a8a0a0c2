"""A real S3 endpoint on loopback for object-store tests: moto's HTTP server, one bucket.

Every rank reaches it through s3fs and botocore's standard environment variables
(``AWS_ENDPOINT_URL`` and credentials), exactly as a job reaches a private S3-compatible store.
The server is killed by pid when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 60
BUCKET = "ckpt"


def require_s3_tools() -> None:
    """Skip without moto/s3fs, except in CI (``RESILIENCY_CI``), where the test must run."""
    missing = []
    for module in ("moto", "s3fs", "boto3"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        why = f"needs {', '.join(missing)} (pip install 'moto[server]' s3fs)"
        if os.environ.get("RESILIENCY_CI"):  # set by .ci/run: CI must run these tests
            pytest.fail(why + ", but RESILIENCY_CI is set")
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def s3_server(log_dir: Path) -> Iterator[dict[str, str]]:
    """Start an S3 server with bucket ``BUCKET``; yield the environment that reaches it."""
    require_s3_tools()
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(log_dir / "s3-server.log", "w")  # noqa: SIM115 -- closed in the finally below
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the S3 server on {endpoint} did not start within {START_TIMEOUT_S} s: "
                        f"{exc}; see {log_dir / 's3-server.log'}"
                    ) from exc
                time.sleep(0.2)
        import boto3  # noqa: PLC0415 -- only after require_s3_tools

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


def filesystem(env: dict[str, str]) -> Any:
    """An s3fs file system on the test server (for the test's own look at the bucket)."""
    import s3fs  # noqa: PLC0415

    return s3fs.S3FileSystem(
        key=env["AWS_ACCESS_KEY_ID"],
        secret=env["AWS_SECRET_ACCESS_KEY"],
        client_kwargs={"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": "us-east-1"},
        skip_instance_cache=True,
        use_listings_cache=False,
    )
