"""The c10d ``TCPStore`` backend: the job's own store, nothing to deploy.

A ``TCPStore`` has no leases, no prefix listing and no watch; this module builds each on the
store's own operations, with a fixed number of round trips:

- liveness: a ``ttl`` value is stored with a small header (the writer's wall time and the ttl);
  a reader treats it as absent once ``now - written > ttl``. The clocks of the job's hosts must
  agree to well within the ttl (NTP does).
- listing: each parent ``P/`` has an index key ``P/__index__`` to which a writer appends a
  child's name the first time this process puts it (``append``: one extra round trip per new
  key, none in steady state). ``list(P/)`` = ``check`` + ``get`` of the index + one
  ``multi_get`` of every child: 3 round trips, whatever the number of children.
- delete: a tombstone (an empty value), so that ``multi_get`` never waits for a missing key.
- watch: ``wait_for_change`` polls the key (``check`` + ``get``) until the deadline.
- compare-and-set: the store's ``compare_set``.

Steady-state cost of a sensor: one ``set`` per interval.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from resiliency.supervisor.backend import Backend, BackendURL
from resiliency.supervisor.errors import BackendError, BackendUnavailableError

__all__ = ["TcpStoreBackend"]

_TTL_MAGIC = b"\x00ttl "
_INDEX = "__index__"
POLL_INTERVAL_S = 0.5


def _parent(key: str) -> tuple[str, str]:
    parent, _, name = key.rpartition("/")
    return parent + "/", name


class TcpStoreBackend(Backend):
    """Supervision state in a c10d ``TCPStore``.

    Args:
        url: the store's host and port, and the job namespace.
        timeout: seconds for the connection and every round trip.
        server: host the store in this process (``is_master=True``) instead of connecting.

    Attributes:
        poll_interval: seconds between two reads in :meth:`wait_for_change` (each read is a
            ``check`` and, when the key exists, a ``get``).
    """

    def __init__(self, url: BackendURL, *, timeout: float = 10.0, server: bool = False) -> None:
        super().__init__(url)
        from torch.distributed import TCPStore  # noqa: PLC0415 - torch loads slowly

        try:
            self._store = TCPStore(
                url.host,
                url.port,
                is_master=server,
                wait_for_workers=False,
                timeout=timedelta(seconds=timeout),
            )
        except (RuntimeError, OSError) as exc:
            raise BackendUnavailableError(f"cannot reach the TCPStore at {url}: {exc}") from exc
        self.port = int(self._store.port)
        self._lock = threading.Lock()
        self._indexed: set[str] = set()
        self.poll_interval = POLL_INTERVAL_S

    # -- helpers -------------------------------------------------------------------------------
    def _call(self, op: str, fn, *args):  # type: ignore[no-untyped-def]
        self.ops[op] += 1
        try:
            with self._lock:
                return fn(*args)
        except (RuntimeError, OSError) as exc:
            raise BackendUnavailableError(f"TCPStore {op} at {self.url} failed: {exc}") from exc

    @staticmethod
    def _unwrap(raw: bytes, now: float) -> bytes | None:
        if not raw:
            return None  # tombstone
        if not raw.startswith(_TTL_MAGIC):
            return raw
        header, _, payload = raw.partition(b"\n")
        try:
            written, ttl = (float(x) for x in header[len(_TTL_MAGIC) :].split())
        except ValueError:
            return None
        return payload if now - written <= ttl else None

    def _index(self, key: str) -> None:
        if key in self._indexed:
            return
        parent, name = _parent(key)
        if "\n" in name or name == _INDEX:
            raise BackendError(f"invalid key name {name!r}")
        append = self._store.append  # type: ignore[attr-defined]
        self._call("append", append, parent + _INDEX, name + "\n")
        self._indexed.add(key)

    # -- Backend -------------------------------------------------------------------------------
    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """See :meth:`Backend.put`."""
        raw = value
        if ttl is not None:
            raw = _TTL_MAGIC + f"{time.time():.6f} {float(ttl):.3f}\n".encode() + value
        self._call("set", self._store.set, key, raw)
        self._index(key)

    def get(self, key: str) -> bytes | None:
        """See :meth:`Backend.get`."""
        if not self._call("check", self._store.check, [key]):
            return None
        raw: bytes = self._call("get", self._store.get, key)
        return self._unwrap(raw, time.time())

    def list(self, prefix: str) -> dict[str, bytes]:
        """See :meth:`Backend.list`."""
        if not prefix.endswith("/"):
            raise BackendError(f"list() needs a prefix ending with '/', got {prefix!r}")
        index = prefix + _INDEX
        if not self._call("check", self._store.check, [index]):
            return {}
        raw_index: bytes = self._call("get", self._store.get, index)
        names = list(dict.fromkeys(n for n in raw_index.decode().split("\n") if n))
        keys = [prefix + n for n in names]
        if not keys:
            return {}
        values: list[bytes] = self._call("multi_get", self._store.multi_get, keys)
        now = time.time()
        out = {}
        for key, raw in zip(keys, values, strict=True):
            value = self._unwrap(raw, now)
            if value is not None:
                out[key] = value
        return out

    def compare_and_set(self, key: str, expected: bytes | None, new: bytes) -> bool:
        """See :meth:`Backend.compare_and_set` (a missing or deleted key matches None)."""
        result: bytes = self._call(
            "compare_set", self._store.compare_set, key, expected or b"", new
        )
        ok = result == new
        if ok:
            self._index(key)
        return ok

    def delete(self, key: str) -> None:
        """See :meth:`Backend.delete` (writes a tombstone)."""
        self._call("set", self._store.set, key, b"")

    def wait_for_change(self, key: str, current: bytes | None, timeout: float) -> bytes | None:
        """See :meth:`Backend.wait_for_change` (polls every :attr:`poll_interval` seconds)."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            value = self.get(key)
            if value != current:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                return current
            time.sleep(min(self.poll_interval, left))

    def close(self) -> None:
        """Drop the connection (the store object is released)."""
        self._store = None  # type: ignore[assignment]
