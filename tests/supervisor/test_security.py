"""The supervisor on a shared etcd: TLS, authentication, one job isolated from another, fenced
controllers, forged intents refused; and the status endpoint's loopback default.

Everything here runs against a real etcd started by the ``secure_etcd`` fixture: https only,
client certificates required, RBAC on, each job's user limited to its own prefix.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path

import pytest
from etcd_server import ETCD, free_port
from secure_etcd import SecureEtcd

from resiliency.supervisor import (
    BackendAuthError,
    BackendError,
    BackendTLSError,
    Controller,
    Decision,
    Intent,
    NodeSensor,
    Observation,
    Policy,
    StaleGenerationError,
    backend_from_url,
    claim_generation,
    keys_for,
    parse_backend_url,
    read_generation,
    read_intent,
    start_status_server,
    write_intent,
)
from resiliency.supervisor.cli import main as supervisor_main

_JOBS = iter(range(1_000_000))


def _job() -> str:
    return f"sec-{next(_JOBS)}-{time.monotonic_ns() % 100_000}"


@pytest.fixture(autouse=True)
def _no_etcdctl_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's ETCDCTL_* variables must not change what these tests connect with."""
    for name in ("ETCDCTL_CACERT", "ETCDCTL_CERT", "ETCDCTL_KEY", "ETCDCTL_USER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ETCDCTL_PASSWORD", raising=False)


# -- URL options ---------------------------------------------------------------------------------
def test_url_options_are_checked_and_a_password_is_never_printed():
    url = parse_backend_url("etcd://h:1/j?cacert=/ca.pem&cert=/c.pem&key=/k.pem&user=bob:s3cret")
    assert url.option("cacert") == "/ca.pem" and url.option("user") == "bob:s3cret"
    assert "s3cret" not in str(url) and "s3cret" not in repr(url)
    assert str(url) == "etcd://h:1/j?cacert=/ca.pem&cert=/c.pem&key=/k.pem&user=bob"
    for bad, says in (
        ("etcd://h:1/j?cacrt=/ca.pem", "unknown option 'cacrt'"),
        ("etcd://h:1/j?cacert=/a&cacert=/b", "given twice"),
        ("etcd://h:1/j?cacert=", "'cacert' is empty"),
        ("tcp://h:1/j?cacert=/a", "takes no options"),
        ("etcd://h:1/j?user=bob:pw&oops", "malformed query"),
        ("etcd://bob:pw@h:1/j", "a user in the address is not used"),
    ):
        with pytest.raises(BackendError, match=says) as info:
            parse_backend_url(bad)
        assert "pw" not in str(info.value)


def test_incomplete_or_unusable_tls_settings_name_the_file_and_where_it_came_from(
    secure_etcd: SecureEtcd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pki, job = secure_etcd.pki, _job()
    a, b = pki.clients["job-a"], pki.clients["job-b"]
    cases = [
        (secure_etcd.url(job, key=""), BackendTLSError, "client cert .* given without its key"),
        (secure_etcd.url(job, cacert=""), BackendTLSError, "sent only over TLS"),
        (
            secure_etcd.url(job, cacert=str(tmp_path / "nope.pem")),
            BackendTLSError,
            r"cacert file '.*nope\.pem' \(from the URL\) does not exist",
        ),
        (
            secure_etcd.url(job, key=str(b.key)),
            BackendTLSError,
            "the key does not match the certificate",
        ),
        (secure_etcd.url(job, user="bob"), BackendAuthError, "user 'bob' .* has no password"),
    ]
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate\n")
    cases.append((secure_etcd.url(job, cacert=str(not_pem)), BackendTLSError, "no usable PEM"))
    for url, error, says in cases:
        with pytest.raises(error, match=says):
            backend_from_url(url, timeout=10)
    # The same settings from etcdctl's environment: the error names the variable.
    monkeypatch.setenv("ETCDCTL_CACERT", str(tmp_path / "missing-ca.pem"))
    monkeypatch.setenv("ETCDCTL_CERT", str(a.cert))
    monkeypatch.setenv("ETCDCTL_KEY", str(a.key))
    with pytest.raises(BackendTLSError, match=r"missing-ca\.pem' \(from ETCDCTL_CACERT\)"):
        backend_from_url(f"etcd://127.0.0.1:{secure_etcd.port}/{job}", timeout=10)


# -- refused, never downgraded -------------------------------------------------------------------
def test_a_wrong_ca_is_refused_naming_the_file_and_the_check(secure_etcd: SecureEtcd):
    job = _job()
    user, password = secure_etcd.add_job(job)
    url = secure_etcd.url(job, user=f"{user}:{password}", cacert=str(secure_etcd.pki.other_ca))
    with pytest.raises(BackendTLSError) as info:
        backend_from_url(url, timeout=10)
    message = str(info.value)
    assert str(secure_etcd.pki.other_ca) in message and "(from the URL)" in message
    assert "not signed by the CA" in message and "chain verification failed" in message


def test_a_missing_client_certificate_is_refused(secure_etcd: SecureEtcd):
    job = _job()
    user, password = secure_etcd.add_job(job)
    with pytest.raises(BackendTLSError, match="no client certificate was sent"):
        backend_from_url(secure_etcd.url(job, client=None, user=f"{user}:{password}"), timeout=10)


def test_a_client_certificate_with_a_common_name_is_a_clear_error(secure_etcd: SecureEtcd):
    job = _job()
    user, password = secure_etcd.add_job(job)
    cn = secure_etcd.pki.with_cn
    url = secure_etcd.url(job, user=f"{user}:{password}", cert=str(cn.cert), key=str(cn.key))
    with pytest.raises(BackendTLSError, match="has a Common Name") as info:
        backend_from_url(url, timeout=10)
    assert str(cn.cert) in str(info.value)


def test_users_without_the_role_or_credentials_are_refused(secure_etcd: SecureEtcd):
    job = _job()
    user, password = secure_etcd.add_job(job)
    nobody, nobody_pw = secure_etcd.add_user_without_role()
    with pytest.raises(BackendAuthError, match=f"permission denied to user '{nobody}'") as info:
        backend_from_url(secure_etcd.url(job, user=f"{nobody}:{nobody_pw}"), timeout=10)
    assert f"'resiliency/{job}/'" in str(info.value)
    with pytest.raises(BackendAuthError, match="wrong user name or password"):
        backend_from_url(secure_etcd.url(job, user=f"{user}:not-{password}"), timeout=10)
    with pytest.raises(BackendAuthError, match="authentication is on and this client gave no user"):
        backend_from_url(secure_etcd.url(job), timeout=10)


def test_a_user_for_an_etcd_without_authentication_is_refused(etcd_server):
    """Credentials given to an etcd that checks none: refused, not silently ignored."""
    with pytest.raises(BackendAuthError, match="authentication is off"):
        backend_from_url(etcd_server.url(_job()) + "?user=alice:pw", timeout=10)


def test_tls_is_never_downgraded_to_plain_http(secure_etcd: SecureEtcd):
    """A server that does not speak TLS gets a TLS handshake, and never a plain request."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    first_bytes: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    first_bytes.append(conn.recv(5))
                except OSError:
                    first_bytes.append(b"")
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    a = secure_etcd.pki.clients["job-a"]
    url = f"etcd://127.0.0.1:{port}/j?cacert={secure_etcd.pki.ca}&cert={a.cert}&key={a.key}"
    try:
        with pytest.raises(BackendTLSError, match=r"does not speak TLS|TLS connection failed"):
            backend_from_url(url, timeout=5)
    finally:
        stop.set()
        thread.join(10)
        listener.close()
    assert first_bytes, "the client never connected"
    # 0x16 0x03: a TLS handshake record. Never b"POST " or b"GET /".
    assert all(b[:2] == b"\x16\x03" for b in first_bytes), first_bytes


def test_an_expired_token_is_renewed_once_and_logged(
    tmp_path: Path, secure_etcd: SecureEtcd, caplog: pytest.LogCaptureFixture
):
    """etcd forgets an idle user's token after --auth-token-ttl: the next request logs in again."""
    short = SecureEtcd(
        tmp_path, str(ETCD), free_port, extra_args=("--auth-token-ttl", "1")
    )  # its own etcd: the session's keeps etcd's default ttl (300 s)
    try:
        job = _job()
        user, password = short.add_job(job)
        backend = backend_from_url(short.url(job, user=f"{user}:{password}"))
        key = backend.namespace + "nodes/n"
        backend.put(key, b"1")
        caplog.set_level(logging.INFO, logger="resiliency.supervisor._etcd")
        deadline = time.monotonic() + 30
        while not any("expired" in r.message for r in caplog.records):
            assert time.monotonic() < deadline, "etcd never expired the token (ttl 1 s)"
            time.sleep(1.5)  # idle longer than the token's ttl
            assert backend.get(key) == b"1"  # answered, with a token renewed when needed
        assert any(f"token of user {user} expired" in r.message for r in caplog.records)
        backend.close()
    finally:
        short.stop()


# -- two jobs on one etcd ------------------------------------------------------------------------
def test_job_b_with_job_a_endpoint_can_neither_read_nor_write_job_a(
    secure_etcd: SecureEtcd, capsys: pytest.CaptureFixture[str]
):
    job_a, job_b = _job(), _job()
    user_a, pw_a = secure_etcd.add_job(job_a)
    user_b, pw_b = secure_etcd.add_job(job_b)
    a = backend_from_url(secure_etcd.url(job_a, user=f"{user_a}:{pw_a}"))
    keys_a = keys_for(a.namespace)
    a.put(keys_a.node("n1"), b'{"secret": 1}')
    claim_generation(a, "controller-of-a")
    # B's controller, given A's job by mistake and B's own certificate and user: refused at once.
    wrong = secure_etcd.url(job_a, client="job-b", user=f"{user_b}:{pw_b}")
    with pytest.raises(BackendAuthError, match=f"permission denied to user '{user_b}'"):
        backend_from_url(wrong)
    with pytest.raises(SystemExit) as exited:
        supervisor_main(["controller", wrong, "--cycles", "1"])
    assert exited.value.code == 2
    assert f"resiliency/{job_a}/" in capsys.readouterr().err
    # B's own connection, aimed at A's keys key by key: every read and write is refused.
    b = backend_from_url(secure_etcd.url(job_b, client="job-b", user=f"{user_b}:{pw_b}"))
    for attempt in (
        lambda: b.get(keys_a.node("n1")),
        lambda: b.list(keys_a.nodes),
        lambda: b.put(keys_a.intent("n1"), b"x"),
        lambda: b.put(keys_a.node("n1"), b"x", ttl=5),
        lambda: b.compare_and_set(keys_a.generation, None, b"x"),
        lambda: b.delete(keys_a.node("n1")),
        lambda: b.wait_for_change(keys_a.intent("n1"), None, 1.0),
    ):
        with pytest.raises(BackendAuthError, match="permission denied"):
            attempt()
    # A's keys are as A left them.
    assert a.get(keys_a.node("n1")) == b'{"secret": 1}'
    generation = read_generation(a)
    assert generation is not None and generation.issuer == "controller-of-a"
    assert a.get(keys_a.intent("n1")) is None
    a.close()
    b.close()


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def test_forged_intents_are_refused_and_logged(
    secure_etcd: SecureEtcd, caplog: pytest.LogCaptureFixture
):
    job = _job()
    user, password = secure_etcd.add_job(job)
    url = secure_etcd.url(job, user=f"{user}:{password}")
    node_side, controller_side = backend_from_url(url), backend_from_url(url)
    keys = keys_for(node_side.namespace)
    generation = claim_generation(controller_side, "controller-1")
    got: list[Intent] = []
    sensor = NodeSensor(
        node_side, "n1", lambda: {"state": "running"}, interval=0.3, gpu=False, ledger_dir=""
    )
    sensor._on_intent = got.append
    sensor.start()
    _wait(lambda: sensor.latest is not None, 20, "the sensor's first document")
    caplog.set_level(logging.ERROR, logger="resiliency.supervisor.sensor")
    number = generation.number
    forged = [
        Intent(1, "n1", "shutdown", "forged", "stale", job=job, generation=number - 1),
        Intent(2, "n1", "shutdown", "forged", "future", job=job, generation=number + 7),
        Intent(3, "n1", "exclude", "forged", "other job", job="job-x", generation=number),
    ]

    def refusals() -> list[str]:
        return [r.message for r in caplog.records if "refusing intent" in r.message]

    for count, intent in enumerate(forged, 1):
        # Written straight into the key by someone holding the job's credentials.
        controller_side.put(keys.intent("n1"), intent.to_json())
        _wait(lambda n=count: len(refusals()) >= n, 20, f"a refusal of forged intent {count}")
    refused = refusals()
    assert "written for generation 0 by ''" in refused[0]
    assert f"job is at generation {number} (claimed by controller-1)" in refused[0]
    assert f"generation {number + 7}" in refused[1]
    assert "it names job 'job-x'" in refused[2]
    assert got == [] and sensor.intent_done == 0
    # The controller's own intent, on top of the forged ones, is acted on.
    intent = write_intent(
        controller_side, "n1", "restart", "test", "real", {}, generation=generation
    )
    assert intent is not None and intent.id == 4 and intent.issuer == "controller-1"
    _wait(lambda: bool(got), 20, "the controller's intent to reach the sensor")
    assert got[0].reason == "real" and got[0].generation == generation.number
    sensor.stop(final=False)
    node_side.close()
    controller_side.close()


class _RestartEachNode(Policy):
    """Restarts node n1, then n2, ...: one new intent every cycle."""

    name = "each"

    def __init__(self) -> None:
        self.cycles = 0

    def decide(self, obs: Observation) -> list[Decision]:
        self.cycles += 1
        return [Decision(f"n{self.cycles}", "restart", self.name, "test", {})]


def test_a_stale_controller_cannot_write_an_intent(
    backend_url: str, caplog: pytest.LogCaptureFixture
):
    first = Controller(backend_from_url(backend_url), [_RestartEachNode()], interval=0.05)
    second = Controller(backend_from_url(backend_url), [_RestartEachNode()], interval=0.05)
    assert first.cycle().intents  # claims generation 1 and writes intent 1
    assert first.generation is not None and first.generation.number == 1
    second.claim()  # a newer controller of the same job (a restart, or a second by mistake)
    assert second.generation is not None and second.generation.number == 2
    before = read_intent(first.backend, "n1")[1]
    with pytest.raises(StaleGenerationError, match=r"generation 1 .* now has generation 2"):
        write_intent(
            first.backend, "n1", "shutdown", "old", "stale", {}, generation=first.generation
        )
    caplog.set_level(logging.ERROR, logger="resiliency.supervisor.controller")
    with pytest.raises(StaleGenerationError):
        first.run(max_cycles=5)
    assert any("stops:" in r.message and first.issuer in r.message for r in caplog.records)
    assert read_intent(first.backend, "n1")[1] == before  # nothing written by the stale one
    stats = second.cycle()
    assert [i.generation for i in stats.intents] == [2]
    current = read_intent(second.backend, "n1")[0]
    assert current is not None and current.generation == 2 and current.id == 2
    raw = json.loads(second.backend.get(keys_for(second.backend.namespace).generation) or b"")
    assert raw["generation"] == 2 and raw["issuer"] == second.issuer
    first.backend.close()
    second.backend.close()


def test_the_controller_logs_and_replaces_an_intent_that_is_not_its_own(
    backend_url: str, caplog: pytest.LogCaptureFixture
):
    backend = backend_from_url(backend_url)
    controller = Controller(backend, [_RestartEachNode()], interval=0.05)
    controller.claim()
    key = keys_for(backend.namespace).intent("n1")
    foreign = Intent(41, "n1", "shutdown", "forged", "x", job="someone-else", generation=9)
    backend.put(key, foreign.to_json())
    caplog.set_level(logging.WARNING, logger="resiliency.supervisor.intents")
    (intent,) = controller.cycle().intents
    assert intent.id == 42 and intent.job == backend.url.job and intent.action == "restart"
    (line,) = [r.message for r in caplog.records if "not this controller's" in r.message]
    assert "intent 41" in line and "names job 'someone-else'" in line
    backend.put(key, b"{not json")
    (intent,) = controller.cycle().intents  # n2 this time; n1's garbage stays untouched
    assert intent.node == "n2"
    assert write_intent(backend, "n1", "restart", "t", "r", {}, generation=controller.generation)
    assert any("holds no valid intent" in r.message for r in caplog.records)
    backend.close()


# -- the status endpoint -------------------------------------------------------------------------
def test_the_status_endpoint_warns_once_when_bound_beyond_loopback(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO, logger="resiliency.supervisor.metrics")
    local = start_status_server(lambda: None, 0)
    assert local.host == "127.0.0.1"
    local.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    wide = start_status_server(lambda: None, 0, "0.0.0.0")
    wide.close()
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"0.0.0.0:{wide.port}" in warnings[0], warnings
