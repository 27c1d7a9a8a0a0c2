"""``inprocess.store``: NVRx's ``TCPStore`` and ``FileStore`` names, and the wrapper's own store."""

from __future__ import annotations

import gc
import socket
import weakref
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from resiliency import inprocess
from resiliency.inprocess.exception import ConfigError
from resiliency.inprocess.store import FileStore, StoreMixin, TCPStore

SHORT = timedelta(seconds=20)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def torch_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """torchrun's variables for rank 0 of 2 on a free MASTER_PORT (yielded)."""
    port = _free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield port


def test_rank_0_hosts_it_from_the_environment_and_rank_1_reaches_it(
    torch_env: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = TCPStore(timeout=SHORT, wait_for_workers=False)
    assert host.hosting and host.port == torch_env and host.critical_ranks == (0,)
    monkeypatch.setenv("RANK", "1")
    client = TCPStore(timeout=SHORT)
    assert not client.hosting
    client.set("from-rank-1", "x")
    assert host.get("from-rank-1") == b"x"


def test_a_host_whose_port_is_taken_by_a_store_connects_to_it(torch_env: int) -> None:
    first = TCPStore(timeout=SHORT, wait_for_workers=False)
    second = TCPStore(timeout=SHORT, wait_for_workers=False)  # rank 0 again: the port is bound
    assert first.hosting and not second.hosting
    second.set("k", "v")
    assert first.get("k") == b"v"


def test_another_host_rank_and_no_host(torch_env: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    host = TCPStore(timeout=SHORT, wait_for_workers=False, tcp_store_host_rank=1)
    assert host.hosting and host.critical_ranks == (1,)
    monkeypatch.setenv("RANK", "0")
    client = TCPStore(timeout=SHORT, tcp_store_host_rank=1)
    assert not client.hosting
    nobody = TCPStore.__new__(TCPStore)
    nobody.tcp_store_host_rank = -1
    assert nobody.critical_ranks == ()


def test_a_missing_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set and no host_name= was given"):
        TCPStore(port=1, world_size=1)


def test_nvrxs_store_factory_and_the_default_store_are_freed_when_the_call_ends(
    torch_env: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    stores: list[weakref.ref[TCPStore]] = []

    def factory(**kwargs: object) -> TCPStore:
        store = inprocess.store.TCPStore(**kwargs)  # type: ignore[arg-type]
        stores.append(weakref.ref(store))
        return store

    def train(call_wrapper: inprocess.CallWrapper | None = None) -> None:
        assert call_wrapper is not None
        if not stores:  # the default store: NVRx's class too
            assert isinstance(call_wrapper._raw_store, TCPStore)
            stores.append(weakref.ref(call_wrapper._raw_store))

    default = inprocess.Wrapper()(train)
    explicit = inprocess.Wrapper(store_factory=factory, store_kwargs={"port": _free_port()})(train)
    gc.disable()  # freed when the call returns, not by a later GC pass
    try:
        default()
        explicit()
        assert len(stores) == 2 and all(ref() is None for ref in stores)
    finally:
        gc.enable()


def test_file_store_is_torchs(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "store"), 1)
    store.set("a", "b")
    assert store.get("a") == b"b"


def test_a_custom_store_written_for_nvrx_subclasses_store_mixin_and_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    made: list[object] = []

    class SharedFileStore(StoreMixin, dist.FileStore):  # NVRx's way to write one
        def __init__(self, file_name: str, world_size: int) -> None:
            super().__init__(file_name, world_size)
            made.append(self)

    @inprocess.Wrapper(
        store_factory=SharedFileStore,
        store_kwargs={"file_name": str(tmp_path / "store"), "world_size": 1},
    )
    def train() -> int:
        return 5

    assert train() == 5
    assert len(made) == 1
    assert all(issubclass(c, StoreMixin) for c in (TCPStore, FileStore))
