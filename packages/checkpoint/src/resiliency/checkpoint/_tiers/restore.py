"""Tiered restore: the newest step every rank can assemble, from the nearest verified copy.

1. Every rank lists what its node's local tier holds (``[step, shard, nonce]`` per shard copy
   whose manifest reads and whose files have their sizes) and the persistent tier's steps; the
   lists are exchanged (one JSON all-gather).
2. Candidates are the local steps for which one save (one nonce) has a copy of EVERY shard
   0..world-1 somewhere, plus the persistent steps. The newest candidate is tried first; a
   step held both locally and persistently is tried locally first.
3. For a local step each shard r gets a source: rank r itself when its node holds the copy,
   else a rank that holds it. A copy from a peer is sent over ``torch.distributed`` and checked
   on arrival (``_replicate``), then kept on this node. Every rank reports its verdict (one
   all-gather): one bad copy marks that copy bad and the plan is made again (another holder,
   else an older step, else the persistent tier) for the WHOLE job, so no rank ever loads a
   different step from the others.
4. Each rank loads its own shard (a one-rank DCP checkpoint), checking its CRC-32s in the same
   pass (``_verified_read``); a corrupt copy or a failed load on any rank again sends the whole
   job to the next option.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import time
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from resiliency.checkpoint import _events, _layout
from resiliency.checkpoint._collectives import json_exchange as _json_collectives
from resiliency.checkpoint._read import verified as _verified_read
from resiliency.checkpoint._tiers import holdings as _holdings
from resiliency.checkpoint._tiers import replicate as _replicate
from resiliency.checkpoint.errors import CheckpointCorruptError, NoCheckpointError

logger = logging.getLogger(__name__)

Copy = tuple[int, str, int, int]  # (step, nonce, shard, holder rank)


class TieredRestore:
    """One restore (see the module docstring); ``run`` is collective."""

    def __init__(
        self,
        *,
        rank: int,
        world: int,
        group: dist.ProcessGroup | None,
        local: Any | None,  # a LocalSaver
        persistent: Any | None,  # a single-root engine (file system or object store)
    ) -> None:
        self.rank, self.world, self.group = rank, world, group
        self.local, self.persistent = local, persistent
        self.bad: set[Copy] = set()
        self.holders: dict[tuple[int, str], dict[int, list[int]]] = {}
        self.persistent_steps: set[int] = set()
        self.local_bytes: dict[tuple[int, str, int], int] = {}

    # ------------------------------------------------------------------ holdings
    def gather(self) -> None:
        held = _holdings.scan(self.local.root, self.world) if self.local is not None else []
        steps = self.persistent.steps() if self.persistent is not None else []
        everyone = _json_collectives.all_gather_json(
            {"held": held, "persistent": steps}, self.group
        )
        for holder, entry in enumerate(everyone):
            for step, shard, nonce, nbytes in entry["held"]:
                if 0 <= shard < self.world:
                    by_shard = self.holders.setdefault((step, nonce), {})
                    by_shard.setdefault(shard, []).append(holder)
                    self.local_bytes[(step, nonce, shard)] = nbytes
        listings = [set(e["persistent"]) for e in everyone]
        self.persistent_steps = set.intersection(*listings) if listings else set()

    def local_candidates(self) -> dict[int, str]:
        """Local steps with a good copy of every shard: step -> nonce (newest nonce wins)."""
        out: dict[int, str] = {}
        for (step, nonce), by_shard in self.holders.items():
            complete = all(
                any((step, nonce, s, h) not in self.bad for h in by_shard.get(s, []))
                for s in range(self.world)
            )
            if complete and (step not in out or nonce > out[step]):
                out[step] = nonce
        return out

    def source(self, step: int, nonce: str, shard: int) -> int:
        good = [
            h for h in self.holders[(step, nonce)][shard] if (step, nonce, shard, h) not in self.bad
        ]
        return shard if shard in good else min(good)

    # ------------------------------------------------------------------ run
    def run(self, state: dict[str, Any], step: int | None) -> tuple[int, str, int] | None:
        """Load the chosen step into ``state``; return ``(step, tier, bytes)`` or None."""
        self.gather()
        failed_persistent: set[int] = set()
        tried_any = False
        while True:
            local = self.local_candidates()
            options = set(local) | (self.persistent_steps - failed_persistent)
            if step is not None:
                options &= {step}
            if not options:
                break
            chosen = max(options)
            tried_any = True
            if chosen in local:
                loaded = self._try_local(state, chosen, local[chosen])
                if loaded is not None:
                    return loaded
                continue
            assert self.persistent is not None
            try:
                got = self.persistent.load(state, step=chosen)
            except (CheckpointCorruptError, NoCheckpointError) as exc:
                logger.warning("persistent step %d unusable: %s", chosen, exc)
                failed_persistent.add(chosen)
                continue
            return (chosen, "persistent", 0) if got is not None else None
        if step is not None and tried_any:
            raise CheckpointCorruptError(f"step {step} failed verification on every tier")
        if step is not None:
            raise NoCheckpointError(f"step {step} can be assembled from no tier")
        if tried_any:
            raise CheckpointCorruptError(
                "no step verifies on every rank in any tier; see the warnings"
            )
        return None

    def _try_local(
        self, state: dict[str, Any], step: int, nonce: str
    ) -> tuple[int, str, int] | None:
        assert self.local is not None
        plan = {s: self.source(step, nonce, s) for s in range(self.world)}
        src = plan[self.rank]
        mine = _holdings.shard_dir(self.local.root, step, self.rank)
        problem = ""
        try:
            problem = self._transfer(step, nonce, plan)
        except _replicate.ReplicationError as exc:
            problem = str(exc)
        if self._drop_bad_copies(step, nonce, plan, problem):
            return None
        # Verified while it loads (one pass, ``_verified_read``): a corrupt copy may have
        # written part of ``state``, which the next option then overwrites whole.
        tier = "local" if src == self.rank else "replica"
        t0 = time.monotonic()
        corrupt = error = ""
        try:
            _verified_read.load_verified(state, mine)
        except _verified_read.CorruptShardError as exc:
            corrupt = str(exc)
        except (Exception, CheckpointException) as exc:
            error = f"loading {mine} failed: {exc}"
        if self._drop_bad_copies(step, nonce, plan, corrupt):
            return None
        errors = _json_collectives.all_gather_json(error, self.group)
        if any(errors):
            logger.warning(
                "step %d: loading failed on some rank: %s", step, [e for e in errors if e]
            )
            for s in range(self.world):
                for h in self.holders[(step, nonce)].get(s, []):
                    self.bad.add((step, nonce, s, h))
            return None
        logger.info(
            "rank %d loaded step %d from its %s copy in %.3f s",
            self.rank,
            step,
            tier,
            time.monotonic() - t0,
        )
        return step, tier, self.local_bytes.get((step, nonce, self.rank), 0)

    def _drop_bad_copies(self, step: int, nonce: str, plan: dict[int, int], problem: str) -> bool:
        """Exchange every rank's verdict on its copy; mark the bad ones. True if any was bad."""
        verdicts = _json_collectives.all_gather_json(problem, self.group)
        failed = [(s, plan[s], p) for s, p in enumerate(verdicts) if p]
        for shard, holder, why in failed:
            logger.warning(
                "step %d: the copy of shard %d held by rank %d is unusable: %s",
                step,
                shard,
                holder,
                why,
            )
            self.bad.add((step, nonce, shard, holder))
        return bool(failed)

    def _transfer(self, step: int, nonce: str, plan: dict[int, int]) -> str:
        """Send the shards this rank is the source of; receive its own when needed."""
        local = self.local
        assert local is not None
        moves = [(s, h) for s, h in plan.items() if h != s]
        if not moves or local.repl_group is None:
            return ""
        outgoing = []
        for shard, holder in moves:
            if holder == self.rank:
                directory = _holdings.shard_dir(local.root, step, shard)
                manifest = _holdings.quick_check(directory)
                if manifest is not None and manifest.get("nonce") != nonce:
                    manifest = None
                outgoing.append(_replicate.Outgoing(shard, directory, manifest))
        incoming = []
        if plan[self.rank] != self.rank:
            incoming.append(
                _replicate.Incoming(
                    plan[self.rank],
                    _holdings.tmp_shard_dir(local.root, step, self.rank, secrets.token_hex(6)),
                )
            )
        try:
            _replicate.exchange(
                local.repl_group,
                outgoing,
                incoming,
                timeout_s=local.tier.timeout_s,
                what=f"restoring step {step} (rank {self.rank})",
                peer_node=local.topology.node_of,
            )
        except _replicate.ReplicationError:
            for i in incoming:
                shutil.rmtree(i.directory, ignore_errors=True)
            raise
        for i in incoming:
            if i.error or i.manifest is None or i.manifest.get("nonce") != nonce:
                shutil.rmtree(i.directory, ignore_errors=True)
                return i.error or f"rank {i.src} sent a copy of another save"
            final = _holdings.shard_dir(local.root, step, self.rank)
            final.parent.mkdir(exist_ok=True)
            _layout.remove_tree(final)
            i.directory.rename(final)
            _layout.fsync_dir(final.parent)
        return ""


def restore(
    state: dict[str, Any],
    step: int | None,
    *,
    rank: int,
    world: int,
    group: dist.ProcessGroup | None,
    local: Any | None,
    persistent: Any | None,
) -> int | None:
    """Run a tiered restore; emit the goodput events; return the step loaded or None."""
    first = "local" if local is not None else "persistent"
    _events.emit("checkpoint_load_started", tier=first)
    t0 = time.monotonic()
    result = TieredRestore(
        rank=rank, world=world, group=group, local=local, persistent=persistent
    ).run(state, step)
    if result is None:
        return None
    chosen, tier, nbytes = result
    if tier != "persistent":  # the persistent manager emits its own event
        _events.emit(
            "checkpoint_loaded",
            step=chosen,
            tier=tier,
            bytes=nbytes,
            duration_s=round(time.monotonic() - t0, 6),
        )
    logger.info("restored step %d from the %s tier", chosen, tier)
    return chosen
