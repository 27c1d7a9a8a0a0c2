"""The etcd v3 backend (the ``etcd`` extra), through etcd's gRPC gateway with ``etcd3gw``.

- liveness: a lease per ttl (etcd rounds a ttl up to whole seconds, 2 s at least); a put with a
  ttl attaches the key to it and refreshes it (``keepalive``, skipped when this process
  refreshed it less than a quarter ttl ago), so the key is deleted by etcd itself about ttl
  seconds after the writer's last put. Steady state of a sensor: one ``put`` and one
  ``keepalive`` per interval (the keepalive writes no key and makes no revision).
- listing: one range request over the prefix.
- watch: ``wait_for_change`` reads the key with its revision, then watches from the next
  revision until the deadline (no polling).
- compare-and-set: one transaction (compare the value, or the create revision for "absent").
"""

from __future__ import annotations

import base64
import math
import threading
import time
from typing import Any

from resiliency.supervisor.backend import Backend, BackendURL
from resiliency.supervisor.errors import BackendError, BackendUnavailableError

__all__ = ["EtcdBackend"]

_MIN_TTL_S = 2


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return _b64(bytes(raw))


class EtcdBackend(Backend):
    """Supervision state in etcd v3.

    Args:
        url: etcd's client endpoint (its gRPC gateway is on the same port) and the namespace.
        timeout: seconds for every request.
    """

    def __init__(self, url: BackendURL, *, timeout: float = 10.0) -> None:
        super().__init__(url)
        try:
            import etcd3gw  # noqa: PLC0415 - optional extra
            from etcd3gw import exceptions as etcd_exceptions  # noqa: PLC0415
        except ImportError as exc:
            raise BackendUnavailableError(
                "the etcd backend needs the etcd3gw package (the 'etcd' extra of "
                "resiliency-supervisor): pip install etcd3gw"
            ) from exc
        self._errors: tuple[type[BaseException], ...] = (
            etcd_exceptions.Etcd3Exception,
            OSError,
        )
        self._watch_timeout = etcd_exceptions.WatchTimedOut
        self._client = etcd3gw.Etcd3Client(host=url.host, port=url.port, timeout=timeout)
        self._lock = threading.Lock()
        self._leases: dict[int, tuple[int, float]] = {}  # ttl -> (lease id, last refresh)
        try:
            self._client.status()
        except self._errors as exc:
            raise BackendUnavailableError(f"cannot reach etcd at {url}: {exc}") from exc

    def _post(self, op: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.ops[op] += 1
        try:
            result: dict[str, Any] = self._client.post(self._client.get_url(path), json=payload)
        except self._errors as exc:
            raise BackendUnavailableError(f"etcd {op} at {self.url} failed: {exc}") from exc
        return result

    def _lease_id(self, ttl: float) -> int:
        seconds = max(_MIN_TTL_S, math.ceil(ttl))
        now = time.monotonic()
        with self._lock:
            lease, refreshed = self._leases.get(seconds, (None, 0.0))
        if lease is not None:
            if now - refreshed < seconds / 4:
                return lease  # refreshed moments ago (several keys share this process's lease)
            answer = self._post("keepalive", "/lease/keepalive", {"ID": lease})
            if int(answer.get("result", {}).get("TTL", -1)) > 0:
                with self._lock:
                    self._leases[seconds] = (lease, now)
                return lease
        granted = self._post("lease_grant", "/lease/grant", {"TTL": seconds, "ID": 0})
        lease = int(granted["ID"])
        with self._lock:
            self._leases[seconds] = (lease, now)
        return lease

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """See :meth:`Backend.put` (a ttl attaches the key to a refreshed lease)."""
        payload: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if ttl is not None:
            payload["lease"] = self._lease_id(ttl)
        self._post("put", "/kv/put", payload)

    def _range(self, key: str) -> tuple[bytes | None, int]:
        answer = self._post("range", "/kv/range", {"key": _b64(key)})
        revision = int(answer.get("header", {}).get("revision", 0))
        kvs = answer.get("kvs") or []
        if not kvs:
            return None, revision
        return base64.b64decode(kvs[0].get("value", "")), revision

    def get(self, key: str) -> bytes | None:
        """See :meth:`Backend.get`."""
        return self._range(key)[0]

    def list(self, prefix: str) -> dict[str, bytes]:
        """See :meth:`Backend.list` (one range request)."""
        if not prefix.endswith("/"):
            raise BackendError(f"list() needs a prefix ending with '/', got {prefix!r}")
        answer = self._post(
            "range", "/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)}
        )
        out = {}
        for kv in answer.get("kvs") or []:
            key = base64.b64decode(kv["key"]).decode()
            if "/" not in key[len(prefix) :]:
                out[key] = base64.b64decode(kv.get("value", ""))
        return out

    def compare_and_set(self, key: str, expected: bytes | None, new: bytes) -> bool:
        """See :meth:`Backend.compare_and_set` (one transaction)."""
        if expected is None:
            compare = {
                "key": _b64(key),
                "result": "EQUAL",
                "target": "CREATE",
                "create_revision": 0,
            }
        else:
            compare = {
                "key": _b64(key),
                "result": "EQUAL",
                "target": "VALUE",
                "value": _b64(expected),
            }
        txn = {
            "compare": [compare],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(new)}}],
            "failure": [],
        }
        answer = self._post("txn", "/kv/txn", txn)
        return bool(answer.get("succeeded", False))

    def delete(self, key: str) -> None:
        """See :meth:`Backend.delete`."""
        self._post("delete", "/kv/deleterange", {"key": _b64(key)})

    def wait_for_change(self, key: str, current: bytes | None, timeout: float) -> bytes | None:
        """See :meth:`Backend.wait_for_change` (a watch from the next revision)."""
        deadline = time.monotonic() + max(0.0, timeout)
        value, revision = self._range(key)
        if value != current:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            return current
        self.ops["watch"] += 1
        try:
            self._client.watch_once(key, timeout=left, start_revision=revision + 1)
        except self._watch_timeout:
            return current
        except self._errors as exc:
            raise BackendUnavailableError(f"etcd watch at {self.url} failed: {exc}") from exc
        return self.get(key)

    def close(self) -> None:
        """Close the HTTP session. Leases are left to expire: a writer that stops is seen as gone
        ttl seconds after its last put, its final state readable until then."""
        self._client.session.close()
