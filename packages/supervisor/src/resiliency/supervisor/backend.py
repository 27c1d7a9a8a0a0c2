"""The ``Backend`` interface: where all cluster state of the supervisor lives.

A backend is a small key-value view over an existing engine (decision 10 of the architecture
guide: no home-made membership or consensus protocol):

- ``put(key, value, ttl=...)``: a value that disappears ``ttl`` seconds after its last put unless
  it is put again (liveness: a dead writer's keys expire instead of going silent);
- ``get(key)`` and ``list(prefix)`` (the live direct children of ``prefix``);
- ``compare_and_set(key, expected, new)`` for intents, and ``guarded_compare_and_set`` that
  also requires a second key's value (the job's generation: a stale controller cannot write);
- ``wait_for_change(key, current, timeout)``: a watch (etcd) or a poll with a deadline (TCPStore).

Every backend counts its round trips to the engine in :attr:`Backend.ops` (by operation name) so
the benchmark and the docs can state the store load precisely.

URLs: ``tcp://HOST:PORT[/JOB]`` (a c10d ``TCPStore``, default scheme) and
``etcd://HOST:PORT[/JOB][?cacert=..&cert=..&key=..&user=..]`` (etcd v3, the ``etcd`` extra; the
query names TLS files and the etcd user, see :mod:`resiliency.supervisor._etcd_auth`). ``/JOB``
names the key namespace; it defaults to ``default``. ``backend_from_url`` (in
:mod:`resiliency.supervisor.connect`, so that no implementation is imported from here) connects
to the engine a URL names.
"""

from __future__ import annotations

import abc
import collections
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from resiliency.supervisor.errors import BackendError

__all__ = ["ETCD_URL_OPTIONS", "Backend", "BackendURL", "parse_backend_url"]

DEFAULT_SCHEME = "tcp"
_DEFAULT_PORTS = {"tcp": 29500, "etcd": 2379}
#: Query parameters of an ``etcd://`` URL: the CA that signs the server's certificate, this
#: client's certificate and key (PEM files), and the etcd user (``NAME`` or ``NAME:PASSWORD``).
#: Each defaults to the ``ETCDCTL_*`` variable of the same meaning. A TCPStore takes none.
ETCD_URL_OPTIONS = ("cacert", "cert", "key", "user")


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL.

    Attributes:
        scheme: ``tcp`` or ``etcd``.
        host: the engine's host.
        port: the engine's port.
        job: the key namespace (one job per namespace).
        options: the URL's query parameters (``etcd://`` only, names in
            :data:`ETCD_URL_OPTIONS`), in URL order. Never printed whole: a password in
            ``user=NAME:PASSWORD`` stays out of logs.
    """

    scheme: str
    host: str
    port: int
    job: str
    options: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def option(self, name: str) -> str | None:
        """The value of query parameter ``name`` (None: not in the URL)."""
        return dict(self.options).get(name)

    def __str__(self) -> str:
        text = f"{self.scheme}://{self.host}:{self.port}/{self.job}"
        if self.options:
            # The user's name is shown, never a password given with it.
            shown = [f"{k}={v.split(':', 1)[0] if k == 'user' else v}" for k, v in self.options]
            text += "?" + "&".join(shown)
        return text


def parse_backend_url(url: str) -> BackendURL:
    """Parse ``tcp://HOST:PORT[/JOB]`` or ``etcd://HOST:PORT[/JOB][?OPTIONS]`` (``HOST:PORT``
    means tcp).

    Args:
        url: the URL.

    Returns:
        The parsed URL.

    Raises:
        BackendError: unknown scheme, missing host, a bad port, or an unknown, repeated or
            misplaced query parameter (a typo in a TLS option is an error, never ignored).
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
        # Port 0 is a real request (any free port, for a store this process hosts).
        port = parts.port if parts.port is not None else _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise BackendError(f"bad port in backend URL {url!r}: {exc}") from None
    if not parts.hostname:
        raise BackendError(f"backend URL {url!r} has no host")
    if "@" in parts.netloc:  # never echoed: it may hold a password
        raise BackendError(
            f"backend URL {scheme}://...@{parts.hostname}: a user in the address is not used; "
            "give it as the user=NAME option, or in ETCDCTL_USER"
        )
    job = parts.path.strip("/") or "default"
    if "/" in job:
        raise BackendError(f"backend URL {url!r}: the job name must not contain '/'")
    return BackendURL(scheme, parts.hostname, port, job, _options(scheme, parts.query, url))


def _options(scheme: str, query: str, url: str) -> tuple[tuple[str, str], ...]:
    # Shown without its query: a password may be in it.
    where = url.split("?", 1)[0]
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise BackendError(f"backend URL {where}: malformed query: {exc}") from None
    if pairs and scheme != "etcd":
        raise BackendError(
            f"backend URL {where}: a {scheme}:// backend takes no options (got "
            f"{', '.join(k for k, _ in pairs)}); TLS and users are etcd:// options"
        )
    seen: set[str] = set()
    for key, value in pairs:
        if key not in ETCD_URL_OPTIONS:
            raise BackendError(
                f"backend URL {where}: unknown option {key!r}; etcd:// takes "
                f"{', '.join(ETCD_URL_OPTIONS)}"
            )
        if key in seen:
            raise BackendError(f"backend URL {where}: option {key!r} given twice")
        if not value:
            raise BackendError(f"backend URL {where}: option {key!r} is empty")
        seen.add(key)
    return tuple(pairs)


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

    def guarded_compare_and_set(
        self, key: str, expected: bytes | None, new: bytes, *, guard: tuple[str, bytes]
    ) -> bool:
        """Set ``key`` to ``new`` if its value is ``expected`` and ``guard``'s key holds its value.

        Used to fence a stale writer: the guard is the job's generation key. This default reads
        the guard, then compares and sets: two round trips, so a guard changed between them is
        not seen (the reader of ``key`` checks the generation again). etcd does it in one
        transaction.

        Args:
            key: the key to set.
            expected: its expected value (None: absent).
            new: the new value.
            guard: ``(key, value)`` that must hold.

        Returns:
            True when the value was set.
        """
        guard_key, guard_value = guard
        if self.get(guard_key) != guard_value:
            return False
        return self.compare_and_set(key, expected, new)

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
