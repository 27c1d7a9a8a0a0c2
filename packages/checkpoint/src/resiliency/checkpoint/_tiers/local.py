"""The local tier's save: a per-rank DCP checkpoint on node-local storage, replicated at save time.

Each rank saves its OWN full state (no cross-rank de-duplication, so a rank can restore from its
shard alone) as a one-rank DCP checkpoint, written by its own persistent writer process from a
shared-memory arena, exactly like the persistent tier (while that writer is still starting, after
a restart, the completion thread writes the save itself from the same arena). Off the training
thread, the rank then

1. agrees on the save's nonce (rank 0's, broadcast on the replication group);
2. writes DCP's ``.metadata`` and the shard's manifest (sizes, CRC-32s, nonce, shard = rank);
3. sends the shard to its peer(s) on other nodes and receives the shards it keeps for others,
   each verified against its manifest on arrival (``_replicate``);
4. agrees with every rank that its own shard and every replica are written and verified
   (one all-reduce); only then renames the temporary directories to ``step_<N>/shard_<r>``.

A node that dies mid-transfer makes its peers' waits fail (bounded), the all-reduce fails, and
nothing is committed anywhere. The replication group is a gloo group of its own, so these
collectives never interleave with the training thread's. A failed exchange can leave that group
with its members out of step (gloo also closes the pair that failed); every member then builds
a new one before its next save, so a peer that was only slow costs one step, not every later
local save.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from resiliency.checkpoint import _events, _layout
from resiliency.checkpoint._dcp import planning as _dcp
from resiliency.checkpoint._dcp import staging as _staging
from resiliency.checkpoint._engine.abandon import ABORT_JOIN_S, stop_abandoned
from resiliency.checkpoint._engine.root_check import ensure_writable
from resiliency.checkpoint._tiers import holdings as _holdings
from resiliency.checkpoint._tiers import replicate as _replicate
from resiliency.checkpoint._writer import protocol as _protocol
from resiliency.checkpoint._writer.client import (
    STARTUP_TIMEOUT_S,
    WriterDiedError,
    WriterHungError,
    WriterProcess,
)
from resiliency.checkpoint.errors import SaveFailedError, WriterFailedError
from resiliency.checkpoint.tiers import LocalTier

logger = logging.getLogger(__name__)

_GRACE_S = 30.0


@dataclass
class LocalSave:
    """One local-tier save in flight and its (agreed) outcome."""

    step: int
    tmp: Path
    started: float
    metadata: Any = None
    handed_over: float = 0.0
    blocked_s: float = 0.0
    failed: str = ""
    writer_failed: bool = False
    bytes: int = 0
    replica_bytes: int = 0
    total_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    thread: threading.Thread | None = None
    # The request the rank writes itself, off the training thread, because its writer was
    # still starting (None: the writer process has it).
    in_process: dict[str, Any] | None = None
    abandoned: bool = False  # by close(abort=True): never committed from then on

    def fail(self, message: str, writer: bool = False) -> None:
        if not self.failed:
            self.failed, self.writer_failed = message, writer


class LocalSaver:
    """Saves of one rank on a local tier (see the module docstring)."""

    def __init__(
        self, tier: LocalTier, group: dist.ProcessGroup | None, writer_timeout_s: float
    ) -> None:
        self.tier = tier
        self.root = Path(tier.path).resolve()
        self.group = group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.world = dist.get_world_size(group) if group is not None else 1
        ensure_writable(self.root, self.rank)  # refused now, not at every save
        self.writer_timeout_s = writer_timeout_s
        self.topology = _holdings.Topology.build(tier.node_label(), group)
        if tier.replicas and len(self.topology.nodes) < 2:
            logger.warning(
                "local tier %s: every rank is on node %s; no replica can go to another node",
                self.root,
                self.topology.nodes[0],
            )
        self.peers = self.topology.peers_of(self.rank, tier.replicas)
        self.sources = self.topology.sources_of(self.rank, tier.replicas)
        self.repl_group: dist.ProcessGroup | None = None
        # Set when a collective of the replication group failed: the group's peers may be out
        # of step (one gave up mid-exchange), so it is rebuilt before the next save uses it.
        self._repl_broken = False
        if group is not None:
            self.repl_group = self._new_repl_group()
        if self.topology.ranks_on(self.topology.node_of(self.rank))[0] == self.rank:
            _layout.remove_stale(self.root)
        if group is not None:
            dist.barrier(group=group)  # nobody writes before the stale files are gone
        self._arena = _staging.Arena()
        # A shard's plan depends only on this rank's state structure: planned once, reused.
        self._plan_cache = _dcp.PlanCache()
        self._writer: WriterProcess | None = WriterProcess()
        self.inflight: LocalSave | None = None
        # Held around the abandonment check and the commit: an abandoned save is committed
        # before the abandonment or never.
        self._commit_lock = threading.Lock()

    # ------------------------------------------------------------------ save (training thread)
    def save(self, step: int, state_dict: dict[str, Any]) -> LocalSave:
        """Stage this rank's state for ``step`` and start the completion thread."""
        self.wait_previous()
        t0 = time.monotonic()
        save = LocalSave(
            step=step,
            tmp=_holdings.tmp_shard_dir(self.root, step, self.rank, secrets.token_hex(6)),
            started=t0,
        )
        _events.emit("checkpoint_save_started", step=step, tier="local")
        try:
            self.ensure_repl_group()
            save.tmp.mkdir()
            plan, _ = _dcp.make_plan(
                state_dict, None, {"path": save.tmp}, dict, cache=self._plan_cache
            )
            assert plan is not None
            save.metadata = plan.metadata
            self._stage_and_send(save, plan)
        except (WriterDiedError, WriterHungError) as exc:
            save.fail(f"rank {self.rank}: checkpoint writer unusable: {exc}", writer=True)
        except Exception as exc:
            save.fail(f"rank {self.rank}: staging step {step} for the local tier failed: {exc!r}")
        save.blocked_s = time.monotonic() - t0
        save.handed_over = time.monotonic()
        self.inflight = save
        save.thread = threading.Thread(
            target=self._complete, args=(save,), name=f"ckpt-local-{step}", daemon=True
        )
        save.thread.start()
        return save

    def _new_repl_group(self) -> dist.ProcessGroup:
        assert self.group is not None
        return dist.new_group(
            dist.get_process_group_ranks(self.group),
            backend="gloo",
            timeout=timedelta(seconds=self.tier.timeout_s),
            use_local_synchronization=True,  # only the members, whatever the world
        )

    def ensure_repl_group(self) -> None:
        """Build a fresh replication group if an exchange failed since the last one.

        Collective over the group's members, which all see the failure (see ``_collective``).
        The old group is left to its timeouts, not destroyed: destroying a gloo group with an
        operation still pending on a dead pair can block.
        """
        if not self._repl_broken:
            return
        t0 = time.monotonic()
        self.repl_group = self._new_repl_group()
        self._repl_broken = False
        logger.warning(
            "rank %d: replication group rebuilt after a failed transfer (%.3f s)",
            self.rank,
            time.monotonic() - t0,
        )

    def _collective(self, fn: Any, *args: Any) -> Any:
        """Run one step of the replication protocol; a failure marks the group for rebuild.

        When one member fails mid-protocol the others fail too (their next wait on it times
        out), so every member marks the group and rebuilds it at the same save.
        """
        try:
            return fn(*args)
        except Exception:
            self._repl_broken = True
            raise

    def _stage_and_send(self, save: LocalSave, plan: _dcp.Plan) -> None:
        if self._writer is None or not self._writer.alive():
            if self._writer is not None:
                self._writer.kill()
            self._writer = WriterProcess()
        # No wait for the writer's start-up here: a writer still importing torch (at the first
        # save after a restart, on a busy node) must not block the training step.
        items = plan.items()
        values = [plan.resolve(item) for item in items]
        slots, total = _staging.layout(values)
        self._arena.ensure(total)
        _staging.stage(self._arena, values, slots)
        del values
        request = {
            "type": "save",
            "job": save.tmp.name,
            "dir": str(save.tmp),
            "prefix": plan.prefix,
            "items": [
                _dcp.item_to_json(item, slot.offset, slot.nbytes)
                for item, slot in zip(items, slots, strict=True)
            ],
        }
        if not self._writer.poll_ready():
            # After a restart the writer imports torch beside every other rank's processes
            # (seconds on a busy node), and the next save would block the training step on this
            # one. The completion thread writes this save itself instead.
            save.in_process = request
            return
        if self._writer.arena_generation != self._arena.generation:
            self._writer.send_arena(self._arena.fd, self._arena.size, self._arena.generation)
        self._writer.send(request)

    def wait_previous(self, timeout: float | None = None) -> None:
        """Wait for the save in flight; raise its (agreed) failure once."""
        save = self.inflight
        if save is None:
            return
        bound = max(STARTUP_TIMEOUT_S, self.writer_timeout_s) + self.writer_timeout_s
        bound += self.tier.timeout_s + _GRACE_S
        if not save.done.wait(bound if timeout is None else timeout):
            if timeout is not None:
                raise TimeoutError(f"the local save of step {save.step} is still in flight")
            raise SaveFailedError(f"the local save of step {save.step} did not finish in time")
        self.inflight = None
        if save.error is not None:
            raise save.error

    # ------------------------------------------------------------------ completion (thread)
    def _local_part(self, save: LocalSave) -> dict[str, Any] | None:
        if save.failed or self._writer is None:
            return None
        if save.in_process is not None:
            reply = self._write_in_process(save, save.in_process)
            if reply is None:
                return None
        else:
            try:
                self._writer.wait_ready(
                    save.handed_over + max(STARTUP_TIMEOUT_S, self.writer_timeout_s)
                )
                reply = self._writer.recv(time.monotonic() + self.writer_timeout_s)
            except (WriterDiedError, WriterHungError, _protocol.ProtocolError) as exc:
                self._writer.kill()
                save.fail(f"rank {self.rank}: local-tier writer failed: {exc}", writer=True)
                return None
        if reply.get("type") == "error" or reply.get("job") != save.tmp.name:
            save.fail(f"rank {self.rank}: writing step {save.step} locally failed: {reply}")
            return None
        files: dict[str, Any] = reply["files"]
        _dcp.finish(save.tmp, save.metadata, [reply["results"]])
        size, crc = _layout.file_checksum(save.tmp / ".metadata")
        files[".metadata"] = {"size": size, _layout.CHECKSUM: crc}
        return files

    def _write_in_process(self, save: LocalSave, request: dict[str, Any]) -> dict[str, Any] | None:
        t0 = time.monotonic()
        try:
            reply = _dcp.write_request(request, self._arena.mapping)
        except Exception as exc:
            save.fail(f"rank {self.rank}: writing step {save.step} locally failed: {exc!r}")
            return None
        logger.info(
            "rank %d: step %d written to the local tier by the rank itself in %.3f s (its "
            "writer process was still starting)",
            self.rank,
            save.step,
            time.monotonic() - t0,
        )
        return reply

    def _nonce(self) -> str:
        value = torch.tensor([secrets.randbits(62)], dtype=torch.int64)
        if self.repl_group is not None:
            dist.broadcast(value, dist.get_global_rank(self.repl_group, 0), group=self.repl_group)
        return f"{int(value.item()):016x}"

    def _complete(self, save: LocalSave) -> None:
        incoming: list[_replicate.Incoming] = []
        try:
            try:
                files = self._local_part(save)
            except Exception as exc:
                save.fail(f"rank {self.rank}: finishing the local shard failed: {exc!r}")
                files = None
            nonce = self._collective(self._nonce)
            manifest = None
            if files is not None:
                manifest = json.loads(_layout.build_manifest(save.step, nonce, self.world, files))
                manifest["shard"] = self.rank
                _layout.write_durable(save.tmp / _layout.MANIFEST, json.dumps(manifest).encode())
                _layout.fsync_dir(save.tmp)
                save.bytes = int(manifest["bytes"])
            incoming = [
                _replicate.Incoming(
                    src, _holdings.tmp_shard_dir(self.root, save.step, src, secrets.token_hex(6))
                )
                for src in self.sources
            ]
            if self.repl_group is not None:
                self._collective(self._send_replicas, save, nonce, manifest, incoming)
            code = torch.tensor([1 if save.failed else 0], dtype=torch.int64)
            if self.repl_group is not None:
                self._collective(self._agree, code)
            if int(code.item()) == 0:
                with self._commit_lock:
                    if save.abandoned:
                        save.fail(f"the local save of step {save.step} was abandoned")
                    else:
                        self._commit(save, incoming)
            else:
                save.fail(f"another rank failed its part of step {save.step}")
        except Exception as exc:
            logger.exception("local save of step %d failed", save.step)
            save.fail(f"rank {self.rank}: local save of step {save.step}: {exc}")
        finally:
            if save.failed:
                for path in [save.tmp, *(i.directory for i in incoming)]:
                    shutil.rmtree(path, ignore_errors=True)
                kind = WriterFailedError if save.writer_failed else SaveFailedError
                save.error = kind(
                    f"local save of step {save.step} failed; the previous step is intact: "
                    f"{save.failed}"
                )
            self._report(save)
            save.done.set()

    def _agree(self, code: torch.Tensor) -> None:
        assert self.repl_group is not None
        dist.all_reduce(code, op=dist.ReduceOp.MAX, group=self.repl_group)

    def _send_replicas(
        self,
        save: LocalSave,
        nonce: str,
        manifest: dict[str, Any] | None,
        incoming: list[_replicate.Incoming],
    ) -> None:
        assert self.repl_group is not None
        t0 = time.monotonic()
        outgoing = [_replicate.Outgoing(dst, save.tmp, manifest) for dst in self.peers]
        _replicate.exchange(
            self.repl_group,
            outgoing,
            incoming,
            timeout_s=self.tier.timeout_s,
            what=f"replicating step {save.step} (rank {self.rank})",
            peer_node=self.topology.node_of,
        )
        for i in incoming:
            if i.error:
                save.fail(f"rank {self.rank}: replica of rank {i.src}: {i.error}")
            elif i.manifest is None or i.manifest.get("nonce") != nonce:
                save.fail(f"rank {self.rank}: replica of rank {i.src} is of another save")
            save.replica_bytes += i.bytes
        if incoming and not save.failed:
            _events.saved(save.step, "replica", save.replica_bytes, 0.0, time.monotonic() - t0)

    def _commit(self, save: LocalSave, incoming: list[_replicate.Incoming]) -> None:
        step_dir = _layout.step_dir(self.root, save.step)
        step_dir.mkdir(exist_ok=True)
        moves = [(save.tmp, self.rank)] + [(i.directory, i.src) for i in incoming]
        for tmp, shard in moves:
            final = _holdings.shard_dir(self.root, save.step, shard)
            _layout.remove_tree(final)  # an older save of the same step (never committed whole)
            tmp.rename(final)
        _layout.fsync_dir(step_dir)
        _layout.fsync_dir(self.root)
        self._retention()

    def _retention(self) -> None:
        steps = _holdings.committed_steps(self.root)
        for step in steps[: -self.tier.keep_last]:
            with contextlib.suppress(OSError):
                _layout.remove_tree(_layout.step_dir(self.root, step))

    def _report(self, save: LocalSave) -> None:
        save.total_s = time.monotonic() - save.started
        if save.failed:
            _events.emit("checkpoint_save_failed", step=save.step, tier="local", error=save.failed)
            logger.error("local save of step %d failed: %s", save.step, save.failed)
            return
        _events.saved(save.step, "local", save.bytes, save.blocked_s, save.total_s)
        logger.info(
            "step %d saved locally (+%d replica bytes): blocked %.3f s, durable after %.3f s",
            save.step,
            save.replica_bytes,
            save.blocked_s,
            save.total_s,
        )

    # ------------------------------------------------------------------ shutdown
    def close(self, abort: bool = False) -> None:
        """Wait for the save in flight (errors logged), then stop the writer.

        Args:
            abort: no collective: the save in flight is abandoned and the writer killed.
        """
        if abort:
            self._abort_close()
            return
        try:
            self.wait_previous()
        except SaveFailedError as exc:
            logger.warning("%s", exc)
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._arena.close()

    def _abort_close(self) -> None:
        save, self.inflight = self.inflight, None
        writer, self._writer = self._writer, None
        try:
            if save is not None and not save.done.is_set():
                locked = self._commit_lock.acquire(timeout=ABORT_JOIN_S)
                save.abandoned = True
                if locked:
                    self._commit_lock.release()
                logger.warning(
                    "rank %d: close(abort=True): abandoning the local save of step %d in flight "
                    "under %s (no agreement with the other ranks: a peer may be dead or the "
                    "process groups aborted)%s",
                    self.rank,
                    save.step,
                    self.root,
                    "" if locked else "; its commit was under way and may still complete",
                )
            stop_abandoned(
                writer,
                save.thread if save is not None else None,
                rank=self.rank,
                step=save.step if save is not None else -1,
            )
        finally:
            self._arena.close()
