"""The store operations of the job-wide exchanges, over the supervisor's backend (e.g. etcd).

The exchanges of :mod:`._job_verdict` and :mod:`._job_failure` talk to a c10d ``Store`` (the
round's TCPStore). :class:`BackendStore` gives them the same operations on a supervisor
``Backend`` (``resiliency.supervisor``: a TCPStore or etcd v3), through its public interface
only, so a job whose state lives in etcd reaches the same verdict with the same code. The
backend is duck-typed here: the supervisor is an extra of the launcher, never imported by it.

What each operation costs in round trips to the engine: ``set`` 1; ``get`` 1 when the key is
there; ``add`` 1 to read (``amount`` 0), else 2 per attempt (read, compare-and-set);
``check``, ``multi_get`` and ``wait`` read every key below one parent in **one** range read
(``list``), whatever their number, plus a watch while a key is missing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

__all__ = ["BackendStore", "BackendStoreError", "BackendStoreTimeoutError"]


class BackendStoreError(RuntimeError):
    """The backend failed (etcd unreachable, refused): a RuntimeError, as torch's store raises,
    so the exchanges treat it like a round store whose host is gone."""


class BackendStoreTimeoutError(BackendStoreError):
    """A wait for keys passed its deadline (its message says "timeout", like torch's)."""


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class BackendStore:
    """c10d-style ``set``/``get``/``add``/``check``/``multi_get``/``wait`` on a Backend.

    Args:
        backend: a ``resiliency.supervisor.Backend`` (``put``, ``get``, ``list``,
            ``compare_and_set``, ``wait_for_change``, ``namespace``).
        prefix: the keys' prefix below the backend's job namespace (e.g. the round's).
        timeout: the default deadline of ``get`` and ``wait``, in seconds.

    Every operation raises :class:`BackendStoreError` when the backend fails.
    """

    def __init__(self, backend: Any, prefix: str = "", timeout: float = 300.0) -> None:
        self.backend = backend
        self._root = f"{backend.namespace}{prefix}"
        self._timeout = timeout

    def _key(self, key: str) -> str:
        return self._root + key

    def _call(self, op: str, *args: Any) -> Any:
        """One backend operation; its failure becomes a :class:`BackendStoreError`."""
        try:
            return getattr(self.backend, op)(*args)
        except Exception as exc:  # duck-typed backend: any of its errors, re-raised with context
            raise BackendStoreError(
                f"{op} on {getattr(self.backend, 'url', self.backend)!r} failed: {exc}"
            ) from exc

    def set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` at ``key``."""
        self._call("put", self._key(key), _as_bytes(value))

    def get(self, key: str) -> bytes:
        """The value at ``key``, waiting for it up to the default deadline.

        Raises:
            BackendStoreTimeoutError: the key is still missing at the deadline.
        """
        value = self._call("get", self._key(key))
        return value if value is not None else self.multi_get([key], wait=True)[0]

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 when absent); return the new value."""
        full = self._key(key)
        while True:
            current = self._call("get", full)
            value = int(current or b"0") + amount
            if amount == 0 or self._call("compare_and_set", full, current, str(value).encode()):
                return value

    def check(self, keys: Sequence[str]) -> bool:
        """True when every key exists."""
        return None not in self._read(keys)

    def multi_get(self, keys: Sequence[str], *, wait: bool = False) -> list[bytes]:
        """The values at ``keys``, in order; with ``wait``, wait for missing keys first.

        Raises:
            KeyError: a key is missing (without ``wait``).
            BackendStoreTimeoutError: ``wait`` and a key is still missing at the deadline.
        """
        if wait:
            self.wait(keys)
        values = self._read(keys)
        missing = [k for k, v in zip(keys, values, strict=True) if v is None]
        if missing:
            raise KeyError(f"no value at {missing[:5]} in {self._root!r}")
        return [v for v in values if v is not None]

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        """Block until every key exists.

        Raises:
            BackendStoreTimeoutError: a key is still missing at the deadline.
        """
        limit = timeout.total_seconds() if timeout is not None else self._timeout
        deadline = time.monotonic() + limit
        while True:
            values = self._read(keys)
            missing = [k for k, v in zip(keys, values, strict=True) if v is None]
            if not missing:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendStoreTimeoutError(
                    f"wait timeout: {len(missing)} of {len(keys)} key(s) still missing after "
                    f"{limit:.1f} s (first: {missing[0]!r} in {self._root!r})"
                )
            self._call("wait_for_change", self._key(missing[0]), None, min(left, 5.0))

    def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        """Every key's value (None: absent): one range read per parent of several keys."""
        by_parent: dict[str, list[str]] = {}
        for key in keys:
            full = self._key(key)
            by_parent.setdefault(full.rsplit("/", 1)[0] + "/", []).append(full)
        found: dict[str, bytes | None] = {}
        for parent, fulls in by_parent.items():
            if len(fulls) == 1:
                found[fulls[0]] = self._call("get", fulls[0])
            else:
                children = self._call("list", parent)
                found.update({full: children.get(full) for full in fulls})
        return [found[self._key(key)] for key in keys]
