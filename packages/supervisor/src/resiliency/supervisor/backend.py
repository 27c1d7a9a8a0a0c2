"""The ``Backend`` interface: where all cluster state of the supervisor lives.

A backend is a small key-value view over an existing engine (decision 10 of the architecture
guide: no home-made membership or consensus protocol):

- ``put(key, value, ttl=...)``: a value that disappears ``ttl`` seconds after its last put unless
  it is put again (liveness: a dead writer's keys expire instead of going silent);
- ``get(key)`` and ``list(prefix)`` (the live direct children of ``prefix``);
- ``compare_and_set(key, expected, new)`` for intents;
- ``wait_for_change(key, current, timeout)``: a watch (etcd) or a poll with a deadline (TCPStore).

Every backend counts its round trips to the engine in :attr:`Backend.ops` (by operation name) so
the benchmark and the docs can state the store load precisely.

URLs: ``tcp://HOST:PORT[/JOB]`` (a c10d ``TCPStore``, default scheme) and
``etcd://HOST:PORT[/JOB]`` (etcd v3, the ``etcd`` extra). ``/JOB`` names the key namespace; it
defaults to ``default``.
"""

from __future__ import annotations

import abc
import collections
from dataclasses import dataclass
from urllib.parse import urlsplit

from resiliency.supervisor.errors import BackendError

__all__ = ["Backend", "BackendURL", "backend_from_url", "parse_backend_url"]

DEFAULT_SCHEME = "tcp"
_DEFAULT_PORTS = {"tcp": 29500, "etcd": 2379}


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL.

    Attributes:
        scheme: ``tcp`` or ``etcd``.
        host: the engine's host.
        port: the engine's port.
        job: the key namespace (one job per namespace).
    """

    scheme: str
    host: str
    port: int
    job: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{self.job}"


def parse_backend_url(url: str) -> BackendURL:
    """Parse ``tcp://HOST:PORT[/JOB]`` or ``etcd://HOST:PORT[/JOB]`` (``HOST:PORT`` means tcp).

    Args:
        url: the URL.

    Returns:
        The parsed URL.

    Raises:
        BackendError: unknown scheme, missing host, or a bad port.
    """
    text = url.strip()
    if "://" not in text:
        text = f"{DEFAULT_SCHEME}://{text}"
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise BackendError(
            f"unknown backend scheme {parts.scheme!r} in {url!r}; use tcp://HOST:PORT (the job's "
            "c10d TCPStore) or etcd://HOST:PORT"
        )
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise BackendError(f"bad port in backend URL {url!r}: {exc}") from None
    if not parts.hostname:
        raise BackendError(f"backend URL {url!r} has no host")
    job = parts.path.strip("/") or "default"
    if "/" in job:
        raise BackendError(f"backend URL {url!r}: the job name must not contain '/'")
    return BackendURL(scheme, parts.hostname, port, job)


class Backend(abc.ABC):
    """A key-value view of the engine that holds the job's supervision state.

    Keys are ``/``-separated strings; values are bytes. Implementations are safe to call from
    several threads (they serialize their round trips).

    Attributes:
        url: the parsed URL this backend talks to.
        ops: round trips to the engine so far, by operation name.
    """

    def __init__(self, url: BackendURL) -> None:
        self.url = url
        self.ops: collections.Counter[str] = collections.Counter()

    @property
    def namespace(self) -> str:
        """The prefix of every key of this job: ``resiliency/<job>/``."""
        return f"resiliency/{self.url.job}/"

    @abc.abstractmethod
    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Store ``value`` at ``key``.

        Args:
            key: the key.
            value: the value.
            ttl: when given, the key expires ``ttl`` seconds after this put unless put again.
        """

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """Return the live value at ``key``, or None when absent, deleted or expired."""

    @abc.abstractmethod
    def list(self, prefix: str) -> dict[str, bytes]:
        """Return the live keys directly below ``prefix`` (which ends with ``/``) and values.

        Args:
            prefix: the parent, ending with ``/``.

        Returns:
            ``{full key: value}`` of the live direct children.
        """

    @abc.abstractmethod
    def compare_and_set(self, key: str, expected: bytes | None, new: bytes) -> bool:
        """Atomically set ``key`` to ``new`` if its value is ``expected`` (None: absent).

        Returns:
            True when the value was set.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (no error when absent)."""

    @abc.abstractmethod
    def wait_for_change(self, key: str, current: bytes | None, timeout: float) -> bytes | None:
        """Wait until the value at ``key`` differs from ``current``, at most ``timeout`` seconds.

        Returns:
            The value then (``current`` again when the deadline passed without a change).
        """

    def close(self) -> None:  # noqa: B027 - optional for implementations
        """Release the connection."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def backend_from_url(url: str, *, timeout: float = 10.0, server: bool = False) -> Backend:
    """Connect to the backend a URL names.

    Args:
        url: ``tcp://HOST:PORT[/JOB]`` or ``etcd://HOST:PORT[/JOB]``.
        timeout: seconds every round trip (and the connection) may take.
        server: for ``tcp://`` only: host the ``TCPStore`` in this process instead of
            connecting to the job's (used by a stand-alone controller and by tests).

    Returns:
        The connected backend.

    Raises:
        BackendError: the URL is invalid.
        BackendUnavailableError: the engine cannot be reached, or its client is missing.
    """
    parsed = parse_backend_url(url)
    if parsed.scheme == "etcd":
        from resiliency.supervisor._etcd import EtcdBackend  # noqa: PLC0415 - optional extra

        return EtcdBackend(parsed, timeout=timeout)
    from resiliency.supervisor._tcpstore import TcpStoreBackend  # noqa: PLC0415 - loads torch

    return TcpStoreBackend(parsed, timeout=timeout, server=server)
