"""Connect to the engine a backend URL names: the one place that knows every implementation.

It lives apart from :mod:`resiliency.supervisor.backend` (the interface) so that the
implementations import the interface and nothing imports back: no import circle.
"""

from __future__ import annotations

from resiliency.supervisor._etcd import EtcdBackend
from resiliency.supervisor._tcpstore import TcpStoreBackend
from resiliency.supervisor.backend import Backend, parse_backend_url

__all__ = ["backend_from_url"]


def backend_from_url(url: str, *, timeout: float = 10.0, server: bool = False) -> Backend:
    """Connect to the backend a URL names.

    Args:
        url: ``tcp://HOST:PORT[/JOB]`` or ``etcd://HOST:PORT[/JOB][?cacert=..&cert=..&key=..&
            user=..]`` (TLS files and the etcd user; each defaults to its ``ETCDCTL_*``
            environment variable).
        timeout: seconds every round trip (and the connection) may take.
        server: for ``tcp://`` only: host the ``TCPStore`` in this process instead of
            connecting to the job's (used by a stand-alone controller and by tests).

    Returns:
        The connected backend.

    Raises:
        BackendError: the URL is invalid, or a TLS file is missing or unusable.
        BackendAuthError: etcd refused this client's certificate or credentials.
        BackendUnavailableError: the engine cannot be reached, or its client is missing.
    """
    parsed = parse_backend_url(url)
    if parsed.scheme == "etcd":
        return EtcdBackend(parsed, timeout=timeout)
    return TcpStoreBackend(parsed, timeout=timeout, server=server)
