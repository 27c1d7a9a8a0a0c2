"""The job-wide hang verdict through the supervisor's etcd backend (a real etcd).

``BackendStore`` gives the launcher's exchanges the c10d store operations they use on a
supervisor ``Backend``; here on a throw-away single-member etcd (skipped without the ``etcd``
binary). Three simulated nodes of two ranks: node 1's ranks are stuck in a read, the others wait
in an all-reduce; every node reaches the same verdict naming node 1, in at most five round trips
to etcd each (the backend counts them).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace

import pytest
from etcd_server import ETCD, SKIP_ETCD, EtcdServer, etcd_required

from resiliency.launcher._backend_store import (
    BackendStore,
    BackendStoreError,
    BackendStoreTimeoutError,
)
from resiliency.launcher._job_verdict import JobHangExchange
from resiliency.launcher._shared_state import SharedRoundState, StoreWaitTimeoutError, wait_keys
from resiliency.launcher._supervision import Supervision
from resiliency.launcher.verdict import Frame, judge_frames
from resiliency.supervisor import backend_from_url

_ALL_REDUCE = Frame("/torch/distributed/distributed_c10d.py", 2800, "all_reduce")
_READ = Frame("/job/data/loader.py", 41, "read_shard")


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    if ETCD is None:
        if etcd_required():
            pytest.fail(SKIP_ETCD + ", but RESILIENCY_REQUIRE_ETCD=1")
        pytest.skip(SKIP_ETCD)
    with EtcdServer() as server:
        yield server


@pytest.fixture
def connect(etcd: EtcdServer, request: pytest.FixtureRequest):
    job = request.node.name.replace("[", "-").replace("]", "")
    backends = []

    def make() -> BackendStore:
        backend = backend_from_url(etcd.url(job), timeout=10)
        backend.ops.clear()  # the connection's own check
        backends.append(backend)
        return BackendStore(backend, "round1/", timeout=10)

    yield make
    for backend in backends:
        backend.close()


def test_the_store_operations_behave_like_c10d_s(connect) -> None:
    store = connect()
    assert store.add("hangs", 0) == 0 and store.add("hangs", 2) == 2 and store.add("hangs", 1) == 3
    store.set("e/0", "zero")
    store.set("e/1", b"one")
    assert store.get("e/0") == b"zero"
    assert store.check(["e/0", "e/1"]) and not store.check(["e/0", "e/2"])
    assert store.multi_get(["e/1", "e/0"]) == [b"one", b"zero"]
    with pytest.raises(KeyError, match="e/2"):
        store.multi_get(["e/0", "e/2"])
    # A missing key: the launcher's wait turns the deadline into its own error, naming what.
    with pytest.raises(StoreWaitTimeoutError, match="node 2's evidence"):
        wait_keys(store, ["e/0", "e/2"], 0.5, "node 2's evidence")
    with pytest.raises(BackendStoreTimeoutError, match=r"'.*e/2'"):
        store.wait(["e/2"], timedelta(seconds=0.2))
    store.wait(["e/0", "e/1"], timedelta(seconds=5))


def test_one_hang_verdict_for_every_node_through_etcd(connect) -> None:
    world, ranks, victim = 3, 2, 1
    published: dict[int, BackendStore] = {}
    for node in (victim, 0, 2):  # the victim's monitor finds the hang and announces it
        store = published[node] = connect()
        exchange = JobHangExchange(SharedRoundState(store, world=world, rank=node), wait_s=10)
        frame = _READ if node == victim else _ALL_REDUCE
        frames = {node * ranks + local: frame for local in range(ranks)}
        if node == victim:
            exchange.announce()
        cycle = SimpleNamespace(ranks=dict(enumerate(frames)))
        local = judge_frames(frames)
        assert exchange.contribute(cycle, lambda: None, local=local, restart=0)  # type: ignore[arg-type]
    verdicts = {}
    for node in range(world):  # node 0 judges first, the others read its verdict
        store = connect()
        exchange = JobHangExchange(SharedRoundState(store, world=world, rank=node), wait_s=10)
        verdicts[node] = exchange.judge()
        trips = sum(published[node].backend.ops.values()) + sum(store.backend.ops.values())
        assert trips <= 5, (node, published[node].backend.ops, store.backend.ops)
    assert len({v.summary for v in verdicts.values()}) == 1
    culprits = verdicts[0].culprits
    assert sorted(culprits) == [2, 3] and {verdicts[0].nodes[r] for r in culprits} == {victim}


def test_a_lost_etcd_fails_the_exchange_like_a_lost_round_store() -> None:
    # The exchanges treat a RuntimeError as "the store's host is gone" and judge alone; an etcd
    # that went away must read the same way, not as an unexpected error that ends the launcher.
    if ETCD is None:
        if etcd_required():
            pytest.fail(SKIP_ETCD + ", but RESILIENCY_REQUIRE_ETCD=1")
        pytest.skip(SKIP_ETCD)
    with EtcdServer() as server:
        backend = backend_from_url(server.url("lost"), timeout=2)
        store = BackendStore(backend, "round1/", timeout=2)
        store.set("ft/failure/evidence/0", "{}")
        server.stop()
    try:
        with pytest.raises(BackendStoreError, match="failed") as caught:
            store.get("ft/failure/evidence/0")
        assert isinstance(caught.value, RuntimeError)
        assert not isinstance(caught.value, BackendStoreTimeoutError)
    finally:
        backend.close()


class _NoMonitors:
    """This node's rank monitors, none of which ever reports (only the listener hook is used)."""

    def add_listener(self, listener: object) -> None:
        self.listener = listener


def test_an_etcd_down_at_a_round_start_falls_back_to_the_round_store(caplog) -> None:
    # The launcher opens the exchange's own connection at the first round that needs it: an
    # etcd that is down then must not end the launcher; the round uses its own store.
    if ETCD is None:
        if etcd_required():
            pytest.fail(SKIP_ETCD + ", but RESILIENCY_REQUIRE_ETCD=1")
        pytest.skip(SKIP_ETCD)
    args = SimpleNamespace(
        supervisor=None,
        node_id="n0",
        supervisor_interval=1.0,
        status_host="127.0.0.1",
        status_port=None,
    )
    with EtcdServer() as server:
        args.supervisor = server.url("down")
        supervision = Supervision(args, lambda: None, _NoMonitors())  # connects the sensor
        server.stop()
    try:
        assert supervision.exchange_backend() is None
        assert "cannot connect to" in caplog.text and "round's store" in caplog.text
    finally:
        supervision.stop()
