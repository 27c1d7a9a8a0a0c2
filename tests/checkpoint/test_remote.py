"""Checkpoints on an object store (S3 through s3fs, against a real S3 server on loopback).

Two gloo ranks save and restore through ``CheckpointManager("s3://...")``: the manifest is the
commit point, a corrupt or missing object sends every rank to the same older step, a rank that
dies mid-save commits nothing, and a committed step is a standard DCP checkpoint that
``dcp.load(checkpoint_id="s3://...")`` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from s3_harness import BUCKET, filesystem, s3_server
from tiers_harness import Cluster
from zygote_client import RANK_GROUPS, start_python

from resiliency.checkpoint import (
    AppState,
    CheckpointError,
    CheckpointManager,
    EmergencyCheckpoint,
    LocalTier,
    NoCheckpointError,
    PersistentTier,
    SaveFailedError,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    # s3fs is asynchronous: fsspec runs one event-loop thread (with its self-pipe sockets) per
    # process, started at first use and kept until the process exits.
    pytest.mark.allow_leak("thread", "socket", reason="fsspec's process-wide event loop"),
]

WORKER = Path(__file__).resolve().with_name("remote_worker.py")
RANK_GROUP = Path(__file__).resolve().with_name("rank_group.py")
URL = f"s3://{BUCKET}/job"


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    with s3_server(tmp_path) as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield env


def _job(tmp: Path, scenario: str, *extra: str, ok: bool = True) -> dict[int, dict[str, Any]]:
    out = tmp / f"out-{scenario}-{len(list(tmp.glob('out-*')))}"
    out.mkdir()
    codes = "0,17" if scenario == "die_mid_save" else "0"  # rank 1 dies with exit code 17
    argv = [str(RANK_GROUP), "2", str(out), "150", codes]
    argv += [str(WORKER), "2", URL, scenario, str(out), *extra]
    proc = start_python(RANK_GROUPS, argv, dict(os.environ))
    try:
        code = proc.wait(200)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    logs = "".join(
        f"\n--- rank {r}\n" + (out / f"rank{r}.log").read_text(errors="replace") for r in (0, 1)
    )
    assert code == 0 or not ok, f"{scenario} failed ({code}):\n{logs[-6000:]}"
    return {
        r: json.loads((out / f"rank{r}.json").read_text())
        for r in (0, 1)
        if (out / f"rank{r}.json").exists()
    } | {-1: {"logs": logs}}


def _objects(env: dict[str, str], step: int) -> list[str]:
    fs = filesystem(env)
    prefix = f"{BUCKET}/job/step_{step:09d}"
    return sorted(p.rsplit("/", 1)[-1] for p in fs.find(prefix)) if fs.exists(prefix) else []


def test_two_ranks_save_and_restore_bit_identical_with_retention(
    tmp_path: Path, s3: dict[str, str]
) -> None:
    saved = _job(tmp_path, "save", "--steps", "4", "--keep", "2")
    assert saved[0]["steps"] == saved[1]["steps"] == [3, 4]
    names = _objects(s3, 4)
    assert ".metadata" in names and "manifest.json" in names
    data = [n for n in names if n.endswith(".distcp")]
    assert len(data) == 2, names  # one file per rank, each named by the save's nonce
    manifest = json.loads(filesystem(s3).cat_file(f"{BUCKET}/job/step_000000004/manifest.json"))
    nonce = manifest["nonce"]
    assert sorted(data) == [f"__0_{nonce}_0.distcp", f"__1_{nonce}_0.distcp"]
    assert set(manifest["files"]) == {*data, ".metadata"}
    assert _objects(s3, 1) == [] and _objects(s3, 2) == []  # retention

    loaded = _job(tmp_path, "load")
    for r in (0, 1):
        assert loaded[r]["loaded"] == 4
        assert loaded[r]["identical"] is True
        assert loaded[r]["dcp_identical"] is True  # DCP's own reader agrees


def test_a_corrupt_object_sends_every_rank_to_the_same_older_step(
    tmp_path: Path, s3: dict[str, str]
) -> None:
    _job(tmp_path, "save", "--steps", "3")
    fs = filesystem(s3)
    victim = next(
        p
        for p in fs.find(f"{BUCKET}/job/step_000000003")
        if p.endswith("_0.distcp") and "/__1_" in p
    )
    raw = bytearray(fs.cat_file(victim))
    raw[len(raw) // 2] ^= 0xFF
    fs.pipe_file(victim, bytes(raw))

    loaded = _job(tmp_path, "load")
    assert [loaded[r]["loaded"] for r in (0, 1)] == [2, 2]
    assert loaded[0]["identical"] and loaded[1]["identical"]
    assert "checkpoint step 3 skipped" in loaded[-1]["logs"]
    assert victim.rsplit("/", 1)[-1] in loaded[-1]["logs"]  # the warning names the object

    asked = _job(tmp_path, "load", "--step", "3")
    for r in (0, 1):
        assert asked[r]["error"].startswith("CheckpointCorruptError"), asked[r]


def test_a_step_without_its_manifest_is_not_committed(tmp_path: Path, s3: dict[str, str]) -> None:
    _job(tmp_path, "save", "--steps", "2")
    filesystem(s3).rm_file(f"{BUCKET}/job/step_000000002/manifest.json")
    loaded = _job(tmp_path, "load")
    assert [loaded[r]["loaded"] for r in (0, 1)] == [1, 1]
    assert _objects(s3, 2) == []  # a new job removes what an uncommitted save left


def test_a_rank_dying_mid_save_commits_nothing_and_the_previous_step_restores(
    tmp_path: Path, s3: dict[str, str]
) -> None:
    died = _job(tmp_path, "die_mid_save")
    assert died[0]["error"], "rank 0's wait must fail when rank 1 dies"
    assert "manifest.json" not in _objects(s3, 2)
    loaded = _job(tmp_path, "load")
    assert [loaded[r]["loaded"] for r in (0, 1)] == [1, 1]
    assert loaded[0]["identical"] and loaded[1]["identical"]


def test_local_tier_with_an_object_store_persistent_tier(
    tmp_path: Path, s3: dict[str, str]
) -> None:
    c = Cluster(tmp_path, persistent=URL)
    c.run(12)  # local every step (replicated), persistent every 5
    assert c.persistent_steps() == [5, 10]
    c.wipe(1)  # a replaced node: the local replica (step 12) is newer than the store's 10
    second = c.run(13)
    assert [second[r]["restored"] for r in (0, 1)] == [12, 12]
    c.wipe(0)
    c.wipe(1)  # every local copy lost: the object store restores, bit-identical
    third = c.run(14, order=(1, 0))
    assert [third[r]["restored"] for r in (0, 1)] == [10, 10]
    assert {third[r]["tier"] for r in (0, 1)} == {"persistent"}
    assert third[0]["identical"] and third[1]["identical"]


# ---------------------------------------------------------------------- one process
def test_single_process_round_trip_and_errors(tmp_path: Path, s3: dict[str, str]) -> None:
    state = {"w": torch.randn(64, 64), "n": 3}
    with CheckpointManager(URL, async_save=False) as mgr:
        assert mgr.tiered  # an object store is the tiered engine's persistent tier
        mgr.save(5, state)
        mgr.save(5, state)  # already committed: a no-op, never an overwrite
        assert mgr.steps() == [5]
        target = {"w": torch.zeros(64, 64), "n": 0}
        assert mgr.load(target) == 5
        assert torch.equal(target["w"], state["w"]) and target["n"] == 3
        with pytest.raises(NoCheckpointError):
            mgr.load(target, step=4)
    # Nothing is left in the spool directory: uploaded files and restore copies are removed.
    assert not list(
        Path(tempfile.gettempdir()).glob(f"resiliency-spool-*/rank0-pid{os.getpid()}-*")
    )


def test_an_emergency_save_lands_in_the_object_store(tmp_path: Path, s3: dict[str, str]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    state = {"app": AppState(model, opt)}
    manager = CheckpointManager(
        None,
        tiers=[
            LocalTier(tmp_path / "local", every=10, replicas=0),
            PersistentTier(URL, every=100, spool_dir=tmp_path / "spool"),
        ],
    )
    codes: list[int] = []
    ec = EmergencyCheckpoint(manager, lead=2, exit_fn=codes.append)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        stop = next(step for step in range(1, 50) if ec.should_stop(step))
        with pytest.raises(SystemExit) as exited:
            ec.save_and_exit(stop, state)
        assert exited.value.code == 0 and codes == [0]
        assert "manifest.json" in _objects(s3, stop)  # committed in the store before the exit
    finally:
        ec.close()
        manager.close()
    torch.manual_seed(1)
    fresh = torch.nn.Linear(4, 2)
    assert not torch.equal(fresh.weight, model.weight)
    shutil.rmtree(tmp_path / "local")
    with CheckpointManager(URL) as again:
        assert again.load({"app": AppState(fresh, torch.optim.AdamW(fresh.parameters()))}) == stop
    assert torch.equal(fresh.weight, model.weight)


def test_memory_and_unknown_protocols_are_refused_with_a_hint() -> None:
    with pytest.raises(CheckpointError, match="inside one process"):
        CheckpointManager("memory://ckpt")
    with pytest.raises(CheckpointError, match="driver"):
        CheckpointManager("nosuchproto://bucket/ckpt")
    with pytest.raises(ValueError, match="URLs only"):
        PersistentTier("/shared/ckpt", storage_options={"anon": True})


class _SilentStore:
    """A TCP server that accepts connections and never answers: a store that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.conns.append(self.sock.accept()[0])

    def close(self) -> None:
        # shutdown() wakes the accept() the thread is blocked in (close() alone does not), so
        # no connection is accepted after the list below is closed: one accepted later was
        # left to the garbage collector, an unclosed-socket ResourceWarning in a later test.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=30)
        if self.thread.is_alive():
            raise AssertionError("the silent store's accept thread did not stop within 30 s")
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_a_store_that_stops_answering_fails_the_save_in_bounded_time(
    tmp_path: Path, s3: dict[str, str]
) -> None:
    silent = _SilentStore()
    try:
        tier = PersistentTier(
            URL,
            storage_options={"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{silent.port}"}},
            spool_dir=tmp_path / "spool",
        )
        mgr = CheckpointManager(None, tiers=[tier], writer_timeout_s=3, async_save=False)
        with pytest.raises(SaveFailedError, match="no answer from the store within 3 s"):
            mgr.save(1, {"w": torch.ones(4)})
        assert mgr.steps() == []  # a listing that hangs counts as empty (with a warning)
        assert mgr.load({"w": torch.zeros(4)}) is None
        mgr.close()
    finally:
        silent.close()
