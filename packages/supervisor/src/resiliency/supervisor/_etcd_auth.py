"""Who the etcd backend is and whom it trusts: TLS files and the etcd user, checked up front.

Each setting comes from the ``etcd://`` URL's query, else from the environment variable etcdctl
reads for it, so a shell set up for ``etcdctl`` works unchanged:

| URL option | environment | meaning |
|---|---|---|
| ``cacert`` | ``ETCDCTL_CACERT`` | PEM CA that signs etcd's server certificate; given: https |
| ``cert`` | ``ETCDCTL_CERT`` | this client's PEM certificate (needs ``key`` and a CA) |
| ``key`` | ``ETCDCTL_KEY`` | its private key |
| ``user`` | ``ETCDCTL_USER`` | ``NAME`` or ``NAME:PASSWORD`` (password: ``ETCDCTL_PASSWORD``) |

The files are loaded with the standard ``ssl`` module before any connection, so a missing,
unreadable or mismatched file is an error naming it and where it came from. A TLS failure during
the handshake is explained (:func:`explain_tls_failure`) and never retried over plain HTTP.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from resiliency.supervisor.backend import BackendURL
from resiliency.supervisor.errors import BackendAuthError, BackendTLSError

__all__ = ["ENV_VARS", "EtcdCredentials", "explain_tls_failure", "resolve_credentials"]

logger = logging.getLogger(__name__)

#: URL option -> the etcdctl environment variable that gives it when the URL does not.
ENV_VARS = {
    "cacert": "ETCDCTL_CACERT",
    "cert": "ETCDCTL_CERT",
    "key": "ETCDCTL_KEY",
    "user": "ETCDCTL_USER",
}
PASSWORD_ENV = "ETCDCTL_PASSWORD"  # noqa: S105 - the variable's name, not a password


@dataclass(frozen=True)
class EtcdCredentials:
    """The resolved TLS files and etcd user of one backend URL.

    Attributes:
        cacert: the CA file (None: plain HTTP).
        cert: the client certificate file.
        key: the client key file.
        user: the etcd user name.
        password: the user's password (never printed).
        origin: for each setting given, where it came from ("the URL" or the variable's name).
    """

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    origin: dict[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        """True when the connection is https (a CA is given)."""
        return self.cacert is not None

    def where(self, name: str) -> str:
        """``'PATH' (from ORIGIN)`` for error messages."""
        return f"{getattr(self, name)!r} (from {self.origin.get(name, 'the URL')})"


def resolve_credentials(
    url: BackendURL, environ: Mapping[str, str] | None = None
) -> EtcdCredentials:
    """Resolve and check the TLS files and the user of an ``etcd://`` URL.

    Args:
        url: the parsed URL (its query options win over the environment).
        environ: the environment (None: ``os.environ``).

    Returns:
        The credentials, every file loaded once by ``ssl`` to prove it usable.

    Raises:
        BackendTLSError: a certificate or key without the rest, or a file missing, unreadable,
            not PEM, or a key that does not match its certificate.
        BackendAuthError: a user without a password.
    """
    env = os.environ if environ is None else environ
    values: dict[str, str | None] = {}
    origin: dict[str, str] = {}
    for name, var in ENV_VARS.items():
        if (value := url.option(name)) is not None:
            values[name], origin[name] = value, "the URL"
        elif env.get(var):
            values[name], origin[name] = env[var], var
        else:
            values[name] = None
    user, password = values["user"], None
    if user is not None:
        name, sep, secret = user.partition(":")
        user, password = name, (secret if sep else env.get(PASSWORD_ENV) or None)
        if not user:
            raise BackendAuthError(f"etcd user (from {origin['user']}) has an empty name")
        if password is None:
            raise BackendAuthError(
                f"etcd user {user!r} (from {origin['user']}) has no password: give "
                f"user={user}:PASSWORD, {ENV_VARS['user']}={user}:PASSWORD or {PASSWORD_ENV}"
            )
    creds = EtcdCredentials(values["cacert"], values["cert"], values["key"], user, password, origin)
    _check_files(creds, url)
    if creds.password is not None and not creds.tls:
        logger.warning(
            "etcd at %s:%d: user %s's password goes over plain HTTP (no CA given: cacert=PATH "
            "or %s turns TLS on)",
            url.host,
            url.port,
            user,
            ENV_VARS["cacert"],
        )
    return creds


def _check_files(creds: EtcdCredentials, url: BackendURL) -> None:
    if (creds.cert is None) != (creds.key is None):
        given, missing = ("cert", "key") if creds.cert is not None else ("key", "cert")
        raise BackendTLSError(
            f"etcd at {url.host}:{url.port}: client {given} {creds.where(given)} given without "
            f"its {missing} ({missing}=PATH or {ENV_VARS[missing]})"
        )
    if creds.cert is not None and creds.cacert is None:
        raise BackendTLSError(
            f"etcd at {url.host}:{url.port}: a client certificate {creds.where('cert')} is sent "
            f"only over TLS: give the CA that signs etcd's certificate (cacert=PATH or "
            f"{ENV_VARS['cacert']})"
        )
    if creds.cacert is None:
        return
    for name in ("cacert", "cert", "key"):
        path = getattr(creds, name)
        if path is not None and not os.access(path, os.R_OK):
            problem = "does not exist" if not os.path.exists(path) else "is not readable"
            raise BackendTLSError(f"etcd TLS {name} file {creds.where(name)} {problem}")
    try:
        context = ssl.create_default_context(cafile=creds.cacert)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise BackendTLSError(
            f"etcd TLS cacert file {creds.where('cacert')} holds no usable PEM CA certificate: "
            f"{exc}"
        ) from None
    if creds.cert is not None and creds.key is not None:
        try:
            context.load_cert_chain(creds.cert, creds.key)
        except (ssl.SSLError, OSError) as exc:
            check = (
                "the key does not match the certificate"
                if "KEY_VALUES_MISMATCH" in str(exc)
                else "not a PEM certificate and its unencrypted private key"
            )
            raise BackendTLSError(
                f"etcd TLS client cert {creds.where('cert')} and key {creds.where('key')}: "
                f"{check} ({exc})"
            ) from None


def explain_tls_failure(  # noqa: PLR0911 - one return per check that can fail
    detail: str, creds: EtcdCredentials, url: BackendURL
) -> str:
    """Say which TLS check failed, from the text of a failed connection.

    Args:
        detail: the client's error text (``requests``/``ssl``).
        creds: the credentials in use.
        url: the URL connected to.

    Returns:
        One sentence naming the check and the file it involves, with what to do.
    """
    where = f"etcd at {url.host}:{url.port}"
    if "CERTIFICATE_VERIFY_FAILED" in detail:
        if "mismatch" in detail:
            return (
                f"{where}: the server's certificate does not name {url.host!r} (host name "
                f"check failed); connect with a name or address its certificate lists"
            )
        if "expired" in detail:
            return f"{where}: the server's certificate has expired (validity check failed)"
        return (
            f"{where}: the server's certificate is not signed by the CA in "
            f"{creds.where('cacert')} (chain verification failed: {_ssl_reason(detail)})"
        )
    if "KEY_VALUES_MISMATCH" in detail:
        return f"{where}: client key {creds.where('key')} does not match {creds.where('cert')}"
    if "EOF occurred in violation of protocol" in detail or "alert" in detail:
        sent = (
            f"it refused client certificate {creds.where('cert')}"
            if creds.cert
            else "no client certificate was sent (cert=PATH&key=PATH, or ETCDCTL_CERT and "
            "ETCDCTL_KEY)"
        )
        return (
            f"{where} ended the TLS handshake: it requires a client certificate signed by the "
            f"CA it trusts, and {sent}"
        )
    if "WRONG_VERSION_NUMBER" in detail or "wrong version number" in detail:
        return f"{where} does not speak TLS on this port (is it plain HTTP?): {detail}"
    return f"{where}: TLS connection failed: {detail}"


def _ssl_reason(detail: str) -> str:
    marker = "certificate verify failed: "
    if marker in detail:
        return detail.split(marker, 1)[1].split(" (_ssl", maxsplit=1)[0]
    return detail
