"""The Backend contract, run against both real backends (a TCPStore, and etcd when installed)."""

from __future__ import annotations

import threading
import time

import pytest

from resiliency.supervisor import (
    BackendError,
    BackendUnavailableError,
    backend_from_url,
    parse_backend_url,
)


def test_url_parsing():
    assert str(parse_backend_url("127.0.0.1:1234")) == "tcp://127.0.0.1:1234/default"
    url = parse_backend_url("etcd://h:2379/job-7")
    assert (url.scheme, url.host, url.port, url.job) == ("etcd", "h", 2379, "job-7")
    with pytest.raises(BackendError, match="unknown backend scheme"):
        parse_backend_url("redis://h:1")
    with pytest.raises(BackendError, match="job name"):
        parse_backend_url("tcp://h:1/a/b")


def test_put_get_list_delete(backend_url: str):
    b = backend_from_url(backend_url)
    ns = b.namespace
    assert b.get(ns + "nodes/a") is None
    assert b.list(ns + "nodes/") == {}
    b.put(ns + "nodes/a", b"1")
    b.put(ns + "nodes/b", b"2")
    b.put(ns + "nodes/b", b"3")
    b.put(ns + "other/c", b"4")
    assert b.get(ns + "nodes/b") == b"3"
    assert b.list(ns + "nodes/") == {ns + "nodes/a": b"1", ns + "nodes/b": b"3"}
    b.delete(ns + "nodes/a")
    assert b.get(ns + "nodes/a") is None
    assert b.list(ns + "nodes/") == {ns + "nodes/b": b"3"}
    with pytest.raises(BackendError):
        b.list(ns + "nodes")
    b.close()


def test_ttl_expires_unless_put_again(backend_url: str):
    b = backend_from_url(backend_url)
    key = b.namespace + "nodes/n"
    ttl = 2.0  # etcd's smallest lease
    b.put(key, b"alive", ttl=ttl)
    for _ in range(3):  # refreshed every half ttl: stays
        time.sleep(ttl / 2)
        assert b.get(key) == b"alive"
        b.put(key, b"alive", ttl=ttl)
    deadline = time.monotonic() + ttl * 3 + 2
    while b.get(key) is not None:
        assert time.monotonic() < deadline, "a ttl key did not expire"
        time.sleep(0.1)
    assert b.list(b.namespace + "nodes/") == {}
    b.close()


def test_compare_and_set(backend_url: str):
    b = backend_from_url(backend_url)
    key = b.namespace + "intents/n"
    assert b.compare_and_set(key, None, b"v1")
    assert not b.compare_and_set(key, None, b"v2")
    assert not b.compare_and_set(key, b"wrong", b"v2")
    assert b.compare_and_set(key, b"v1", b"v2")
    assert b.get(key) == b"v2"
    assert b.list(b.namespace + "intents/") == {key: b"v2"}
    b.close()


def test_wait_for_change_sees_a_write_and_honours_its_deadline(backend_url: str):
    b = backend_from_url(backend_url)
    writer = backend_from_url(backend_url)
    key = b.namespace + "intents/w"
    start = time.monotonic()
    assert b.wait_for_change(key, None, 0.5) is None
    assert 0.4 < time.monotonic() - start < 10  # expected 0.5 s; the bound is 20x that
    timer = threading.Timer(0.3, lambda: writer.put(key, b"new"))
    timer.start()
    start = time.monotonic()
    assert b.wait_for_change(key, None, 10) == b"new"
    assert time.monotonic() - start < 5  # expected 0.3 s (the timer), well short of the 10 s wait
    timer.join()
    b.close()
    writer.close()


def test_steady_state_is_one_write_per_publication(backend_url: str):
    b = backend_from_url(backend_url)
    key = b.namespace + "nodes/n"
    b.put(key, b"x", ttl=4)
    before = dict(b.ops)
    for _ in range(5):
        b.put(key, b"x", ttl=4)
    writes = {op: n - before.get(op, 0) for op, n in b.ops.items() if n != before.get(op, 0)}
    if b.url.scheme == "tcp":
        assert writes == {"set": 5}
    else:  # one KV write; the lease keepalive (at most one per put) writes no key
        assert writes.pop("put") == 5 and writes.pop("keepalive", 0) <= 5 and not writes
    b.close()


def test_unreachable_backend_is_a_clear_error():
    with pytest.raises(BackendUnavailableError, match="cannot reach"):
        backend_from_url("etcd://127.0.0.1:1/x", timeout=1)
