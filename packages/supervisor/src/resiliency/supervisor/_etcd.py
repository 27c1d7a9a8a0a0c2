"""The etcd v3 backend (the ``etcd`` extra), through etcd's gRPC gateway with ``etcd3gw``.

- liveness: a lease per ttl (etcd rounds a ttl up to whole seconds, 2 s at least); a put with a
  ttl attaches the key to it and refreshes it (``keepalive``, skipped when this process
  refreshed it less than a quarter ttl ago), so the key is deleted by etcd itself about ttl
  seconds after the writer's last put. Steady state of a sensor: one ``put`` and one
  ``keepalive`` per interval (the keepalive writes no key and makes no revision).
- listing: one range request over the prefix.
- watch: ``wait_for_change`` reads the key with its revision, then watches from the next
  revision until the deadline (no polling).
- compare-and-set: one transaction (compare the value, or the create revision for "absent");
  guarded by the job's generation: one transaction with both compares.
- security: https with the CA, client certificate and key of :mod:`._etcd_auth`; an etcd user
  authenticates once (``/auth/authenticate``) and its token rides on every request, renewed
  when etcd says it expired. The HTTP session ignores ``REQUESTS_CA_BUNDLE`` and proxies from
  the environment (``trust_env`` off): requests would otherwise verify etcd against that bundle
  instead of the CA given. A TLS failure is an error, never a retry over plain HTTP.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from resiliency.supervisor._etcd_auth import (
    ENV_VARS,
    EtcdCredentials,
    explain_tls_failure,
    resolve_credentials,
)
from resiliency.supervisor.backend import Backend, BackendURL
from resiliency.supervisor.errors import (
    BackendAuthError,
    BackendError,
    BackendTLSError,
    BackendUnavailableError,
)

__all__ = ["EtcdBackend"]

logger = logging.getLogger(__name__)

_MIN_TTL_S = 2
#: etcd's gRPC gateway answers this (HTTP 400) to a client certificate with a Common Name.
_GATEWAY_CN = "CommonName of client sending a request against gateway"


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return _b64(bytes(raw))


def _compare(key: str, expected: bytes | None) -> dict[str, Any]:
    """A transaction compare: ``key`` holds ``expected`` (None: the key does not exist)."""
    if expected is None:
        return {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}
    return {"key": _b64(key), "result": "EQUAL", "target": "VALUE", "value": _b64(expected)}


class EtcdBackend(Backend):
    """Supervision state in etcd v3.

    Args:
        url: etcd's client endpoint (its gRPC gateway is on the same port), the namespace, and
            the TLS files and user (URL options, else the ``ETCDCTL_*`` variables).
        timeout: seconds for every request.

    Raises:
        BackendTLSError: a TLS file is unusable, or the handshake failed (named check).
        BackendAuthError: etcd refused the user, or the user may not read the job's prefix.
        BackendUnavailableError: etcd cannot be reached, or etcd3gw is not installed.
    """

    def __init__(self, url: BackendURL, *, timeout: float = 10.0) -> None:
        super().__init__(url)
        try:
            import etcd3gw  # noqa: PLC0415 - optional extra
            import requests  # noqa: PLC0415 - etcd3gw's own dependency
            from etcd3gw import exceptions as etcd_exceptions  # noqa: PLC0415
        except ImportError as exc:
            raise BackendUnavailableError(
                "the etcd backend needs the etcd3gw package (the 'etcd' extra of "
                "resiliency-supervisor): pip install etcd3gw"
            ) from exc
        self._etcd_error = etcd_exceptions.Etcd3Exception
        self._watch_timeout = etcd_exceptions.WatchTimedOut
        self.credentials: EtcdCredentials = resolve_credentials(url)
        creds = self.credentials
        session = requests.Session()
        session.trust_env = False
        if creds.cacert is not None:
            session.verify = creds.cacert
        if creds.cert is not None and creds.key is not None:
            session.cert = (creds.cert, creds.key)
        self._client = etcd3gw.Etcd3Client(
            host=url.host,
            port=url.port,
            protocol="https" if creds.tls else "http",
            timeout=timeout,
            session=session,
        )
        self._lock = threading.Lock()
        self._leases: dict[int, tuple[int, float]] = {}  # ttl -> (lease id, last refresh)
        try:
            self._connect()
        except BaseException:
            session.close()
            raise

    def _connect(self) -> None:
        creds, url = self.credentials, self.url
        try:
            self._client.status()
        except self._etcd_error as exc:
            raise self._translate("connect", None, exc) from None
        except OSError as exc:
            raise BackendUnavailableError(f"cannot reach etcd at {url}: {exc}") from exc
        if creds.user is not None:
            self._authenticate()
        # Fail now, not in a sensor thread later: this user may read the job's prefix.
        ns = self.namespace
        self._post(
            "range",
            "/kv/range",
            {"key": _b64(ns), "range_end": _prefix_end(ns), "count_only": True},
            key=ns,
        )
        tls = "plain HTTP"
        if creds.tls:
            tls = f"TLS, CA {creds.cacert}"
            tls += f", client certificate {creds.cert}" if creds.cert else ""
        user = f"user {creds.user}" if creds.user else "no user"
        logger.info("etcd at %s:%d: %s, %s", url.host, url.port, tls, user)

    def _authenticate(self) -> None:
        creds = self.credentials
        # etcd rejects a login that carries an expired token: log in without one.
        self._client.session.headers.pop("Authorization", None)
        try:
            answer = self._client.post(
                self._client.get_url("/auth/authenticate"),
                json={"name": creds.user, "password": creds.password},
            )
        except self._etcd_error as exc:
            raise self._translate("authenticate", None, exc) from None
        except OSError as exc:
            raise BackendUnavailableError(f"cannot reach etcd at {self.url}: {exc}") from exc
        self._client.session.headers["Authorization"] = str(answer["token"])

    def _translate(  # noqa: PLR0911 - one return per check that can fail
        self, op: str, key: str | None, exc: BaseException
    ) -> BackendError:
        """Turn an etcd3gw error into this package's, naming the check that failed."""
        detail = str(getattr(exc, "detail_text", None) or exc)
        creds, url = self.credentials, self.url
        where = f"etcd {op}" + (f" of {key!r}" if key else "") + f" at {url.host}:{url.port}"
        message = detail
        with contextlib.suppress(ValueError, AttributeError):  # etcd's JSON error, when it is
            message = str(json.loads(detail).get("message", detail))
        if _GATEWAY_CN in detail:
            return BackendTLSError(
                f"{where}: etcd's gRPC gateway (which this backend speaks) refuses client "
                f"certificate {creds.where('cert')} because it has a Common Name: etcd would "
                "ignore it there. Issue the client certificate without a CN (e.g. subject "
                "'/O=<job>') and authenticate as the job's etcd user (user=NAME or "
                f"{ENV_VARS['user']})"
            )
        if "SSL" in detail or "certificate" in detail.lower():
            return BackendTLSError(explain_tls_failure(detail, creds, url))
        if "authentication failed" in message:
            return BackendAuthError(
                f"{where}: user {creds.user!r} ({creds.origin.get('user')}) was refused: "
                "wrong user name or password"
            )
        if "authentication is not enabled" in message:
            return BackendAuthError(
                f"{where}: user {creds.user!r} ({creds.origin.get('user')}) was given, but this "
                "etcd's authentication is off: any client may read and write every key. Turn "
                "it on (docs/supervisor.md, Security), or give no user for an etcd private to "
                "this job"
            )
        if "user name is empty" in message:
            return BackendAuthError(
                f"{where}: etcd's authentication is on and this client gave no user: give the "
                f"job's etcd user (user=NAME:PASSWORD in the URL, or {ENV_VARS['user']})"
            )
        if "permission denied" in message:
            return BackendAuthError(
                f"{where}: permission denied to user {creds.user!r}: its roles do not cover "
                f"this key. The job's prefix is {self.namespace!r}: check the job name in the "
                "URL, or grant the user the job's role (docs/supervisor.md, Security)"
            )
        if "Connection aborted" in detail and not creds.tls:
            return BackendUnavailableError(
                f"{where}: the connection was closed without an answer; if etcd serves TLS, "
                f"give its CA (cacert=PATH or {ENV_VARS['cacert']}): {detail}"
            )
        if op == "connect":
            return BackendUnavailableError(f"cannot reach etcd at {url}: {message}")
        return BackendUnavailableError(f"{where} failed: {message}")

    def _post(
        self, op: str, path: str, payload: dict[str, Any], *, key: str | None = None
    ) -> dict[str, Any]:
        self.ops[op] += 1
        try:
            return self._send(op, path, payload)
        except self._etcd_error as exc:
            detail = str(getattr(exc, "detail_text", None) or exc)
            if self.credentials.user is None or "invalid auth token" not in detail:
                raise self._translate(op, key, exc) from None
        # The token expired (etcd's --auth-token-ttl of idleness): log in again, once.
        logger.info("etcd token of user %s expired; authenticating again", self.credentials.user)
        self._authenticate()
        try:
            return self._send(op, path, payload)
        except self._etcd_error as exc:
            raise self._translate(op, key, exc) from None

    def _send(self, op: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self._client.post(self._client.get_url(path), json=payload)
        except OSError as exc:
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
        self._post("put", "/kv/put", payload, key=key)

    def _range(self, key: str) -> tuple[bytes | None, int]:
        answer = self._post("range", "/kv/range", {"key": _b64(key)}, key=key)
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
            "range",
            "/kv/range",
            {"key": _b64(prefix), "range_end": _prefix_end(prefix)},
            key=prefix,
        )
        out = {}
        for kv in answer.get("kvs") or []:
            key = base64.b64decode(kv["key"]).decode()
            if "/" not in key[len(prefix) :]:
                out[key] = base64.b64decode(kv.get("value", ""))
        return out

    def compare_and_set(self, key: str, expected: bytes | None, new: bytes) -> bool:
        """See :meth:`Backend.compare_and_set` (one transaction)."""
        return self._txn(key, [_compare(key, expected)], new)

    def guarded_compare_and_set(
        self, key: str, expected: bytes | None, new: bytes, *, guard: tuple[str, bytes]
    ) -> bool:
        """See :meth:`Backend.guarded_compare_and_set` (one transaction, both compares)."""
        guard_key, guard_value = guard
        return self._txn(key, [_compare(key, expected), _compare(guard_key, guard_value)], new)

    def _txn(self, key: str, compares: Sequence[dict[str, Any]], new: bytes) -> bool:
        txn = {
            "compare": list(compares),
            "success": [{"request_put": {"key": _b64(key), "value": _b64(new)}}],
            "failure": [],
        }
        answer = self._post("txn", "/kv/txn", txn, key=key)
        return bool(answer.get("succeeded", False))

    def delete(self, key: str) -> None:
        """See :meth:`Backend.delete`."""
        self._post("delete", "/kv/deleterange", {"key": _b64(key)}, key=key)

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
        except self._etcd_error as exc:
            raise self._translate("watch", key, exc) from None
        except OSError as exc:
            raise BackendUnavailableError(f"etcd watch at {self.url} failed: {exc}") from exc
        return self.get(key)

    def close(self) -> None:
        """Close the HTTP session. Leases are left to expire: a writer that stops is seen as gone
        ttl seconds after its last put, its final state readable until then."""
        self._client.session.close()
