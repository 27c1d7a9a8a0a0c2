"""The abort's socket shutdown: only what the function opened, never the wrapper's store."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from resiliency.inprocess import _gloo_sockets


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def connect(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname(), timeout=10)
    accepted, _ = server.accept()
    accepted.settimeout(10)
    return client, accepted


def test_sockets_opened_after_the_snapshot_are_shut_down_and_their_peer_sees_it(
    listener: socket.socket,
) -> None:
    old_client, old_peer = connect(listener)
    baseline = _gloo_sockets.snapshot()
    new_client, new_peer = connect(listener)
    try:
        closed = _gloo_sockets.shutdown_new_tcp(baseline, store_ports=set())
        # the new pair: both ends are in this process, both are new
        assert closed == 2
        assert new_peer.recv(1) == b""  # the peer sees the connection end at once
        with pytest.raises(OSError):
            new_client.sendall(b"x" * 1_000_000)
        # the socket from before the snapshot still works both ways
        old_client.sendall(b"ok")
        assert old_peer.recv(2) == b"ok"
    finally:
        for sock in (old_client, old_peer, new_client, new_peer):
            sock.close()


def test_connections_to_the_wrappers_store_are_kept(listener: socket.socket) -> None:
    baseline = _gloo_sockets.snapshot()
    client, peer = connect(listener)
    try:
        store_port = listener.getsockname()[1]
        assert _gloo_sockets.shutdown_new_tcp(baseline, store_ports={store_port}) == 0
        client.sendall(b"ok")
        assert peer.recv(2) == b"ok"
    finally:
        client.close()
        peer.close()
