"""The one adapter over torch DCP's planning and file format (checked against torch 2.13).

The rank process runs DCP's own planning (``DefaultSavePlanner``: flattening, dedup of
replicated tensors, global metadata) with the gather/scatter DCP's ``save`` does, except that the
plans cross ranks as JSON over byte tensors (``_plan_codec``, ``_json_collectives``), never as
pickled objects (ARCHITECTURE decision 1). The writer process runs DCP's own
``FileSystemWriter.write_data`` on the staged tensors, so the files are byte-for-byte what
``dcp.save`` writes. Rank 0 finishes with ``FileSystemWriter.finish`` (the standard
``.metadata``). Private DCP names used: ``_StoragePrefix`` (here and in ``_plan_codec``) and
``_StorageInfo`` (the storage records of the file-system writer); nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import WriteResult

from resiliency.checkpoint._collectives import json_exchange as _json_collectives
from resiliency.checkpoint._dcp import plan_codec as _plan_codec
from resiliency.checkpoint._dcp import staging as _staging

try:  # the file-system writer's storage records (private in every torch 2.x)
    from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
except ImportError as exc:  # pragma: no cover - only on a torch that renamed them
    raise ImportError(
        f"resiliency.checkpoint needs DCP's file-system storage records; torch "
        f"{torch.__version__} moved them: {exc}"
    ) from exc


def to_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """Call ``state_dict()`` on every Stateful value (what ``dcp.save`` does first)."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}


class Plan:
    """This rank's final DCP save plan and the planner that resolves its items."""

    def __init__(
        self, planner: DefaultSavePlanner, plan: SavePlan, metadata: Metadata | None, version: int
    ) -> None:
        self.planner = planner
        self.version = version  # changes whenever the plan (and so the staging layout) does
        self.plan = plan
        self.metadata = metadata  # the global metadata, on the coordinator only

    @property
    def prefix(self) -> str:
        return str(self.plan.storage_data.prefix)

    def items(self) -> list[WriteItem]:
        return list(self.plan.items)

    def resolve(self, item: WriteItem) -> torch.Tensor | bytes:
        data = self.planner.resolve_data(item)
        if isinstance(data, io.BytesIO):
            return data.getvalue()
        return data.detach()


class PlanCache:
    """The last final plan, reused while the state's structure is the same on every rank."""

    def __init__(self) -> None:
        self.key = 0
        self.plan: SavePlan | None = None
        self.metadata: Metadata | None = None
        self.version = 0


def _structure_key(flat: dict[str, Any]) -> int:
    """A 62-bit digest of the flattened state's names, kinds, dtypes and shapes."""
    parts = []
    for name, value in flat.items():
        if isinstance(value, torch.Tensor):
            parts.append(f"{name}|{type(value).__name__}|{value.dtype}|{tuple(value.shape)}")
        else:
            parts.append(f"{name}|obj")
    digest = hashlib.blake2b("\n".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def make_plan(
    state_dict: dict[str, Any],
    group: dist.ProcessGroup | None,
    extra: dict[str, Any],
    decide: Any,
    *,
    cache: PlanCache | None = None,
    early: Callable[[Plan], None] | None = None,
) -> tuple[Plan | None, dict[str, Any]]:
    """Plan a save across the group, as ``dcp.save`` does, plus a coordinator decision.

    ``decide()`` runs on the coordinator first and returns ``{"nonce": int}``, ``{"skip":
    True}`` or ``{"error": str}``; every rank gets it. When every rank's own state has the same
    structure (names, dtypes, shapes) as at the previous planned save, every local plan and so
    the global plan are unchanged: the cached plan is reused and the whole exchange is one
    all-reduce of three integers; otherwise DCP's gather/scatter of plans runs. With ``early``,
    a rank whose own cache hits calls ``early(plan)`` (the staging copy) while that all-reduce
    is in flight, so the collective's latency hides behind the copy; the returned plan is then
    that same object (when another rank missed, a new plan is made and ``early``'s work is
    simply redone by the caller). A failure on any
    rank becomes an ``"error"`` on every rank; nothing hangs. Returns ``(plan, decision)``.
    """
    rank = dist.get_rank(group) if group is not None else 0
    world = dist.get_world_size(group) if group is not None else 1
    cache = cache if cache is not None else PlanCache()
    planner = DefaultSavePlanner()
    key = -1
    setup_error = ""
    try:
        planner.set_up_planner(state_dict=state_dict, storage_meta=None, is_coordinator=rank == 0)
        key = _structure_key(planner.state_dict)
    except Exception as exc:
        setup_error = f"rank {rank}: planning failed: {exc!r}"
    first: dict[str, Any] = {}
    if rank == 0:
        try:
            first = dict(decide())
        except Exception as exc:
            first = {"error": f"rank 0: could not prepare the step: {exc!r}"}
    hit = int(key >= 0 and cache.plan is not None and cache.key == key)
    code = 2 if first.get("error") else (1 if first.get("skip") else 0)
    low = -(1 << 62)
    vec = [-hit, code if rank == 0 else low, first.get("nonce", 0) if rank == 0 else low]
    optimistic = None
    if hit and not setup_error:
        optimistic = Plan(planner, cache.plan, cache.metadata, cache.version)  # type: ignore[arg-type]
    if group is not None:
        t = torch.tensor(vec, dtype=torch.int64)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
        if optimistic is not None and early is not None:
            with contextlib.suppress(Exception):  # a failure is met again by the caller
                early(optimistic)
        work.wait()
        vec = [int(x) for x in t]
    all_hit = vec[0] == -1  # the minimum of every rank's hit
    if vec[1] == 1:
        return None, {"skip": True}
    if all_hit and vec[1] == 0 and optimistic is not None:
        return optimistic, {"nonce": vec[2]}
    # Local plans go to rank 0 and final plans come back as JSON (see _plan_codec): a rank's
    # failure travels as a string in place of its plan, so every rank learns of it.
    local: Any = setup_error
    if not local:
        try:
            local = _plan_codec.encode_plan(planner.create_local_plan())
        except Exception as exc:
            local = f"rank {rank}: planning failed: {exc!r}"
    gathered = _json_collectives.gather_json(local, 0, group)
    scattered: list[Any] | None = None
    metadata: Metadata | None = None
    if rank == 0:
        assert gathered is not None
        errors = [p for p in gathered if isinstance(p, str)]
        decision: dict[str, Any] = {}
        plans: list[dict[str, Any]] | None = None
        if errors:
            decision = {"error": "; ".join(errors)}
        else:
            try:
                decision = first
                if not decision.get("error"):
                    local_plans = [_plan_codec.decode_plan(p) for p in gathered]
                    central_plans, metadata = planner.create_global_plan(local_plans)
                    central_plans = FileSystemWriter(extra["path"]).prepare_global_plan(
                        central_plans
                    )
                    plans = [_plan_codec.encode_plan(p) for p in central_plans]
            except Exception as exc:
                decision = {"error": f"rank 0: planning failed: {exc!r}"}
        scattered = [
            {
                "plan": plans[i] if plans is not None and not decision.get("error") else None,
                "decision": decision,
            }
            for i in range(world)
        ]
    try:
        received = _json_collectives.scatter_json(scattered, 0, group)
    except ValueError as exc:  # raised on every rank alike: decide() gave a non-JSON value
        return None, {"error": f"rank {rank}: planning failed: {exc}"}
    decision = received["decision"]
    if decision.get("error") or received["plan"] is None:
        return None, decision
    central = _plan_codec.decode_plan(received["plan"])
    final = planner.finish_plan(central)
    cache.key, cache.plan, cache.metadata = key, final, metadata
    cache.version += 1
    return Plan(planner, final, metadata, cache.version), decision


def item_to_json(item: WriteItem, offset: int, nbytes: int) -> dict[str, Any]:
    """Describe a write item and where its staged bytes lie in the arena."""
    out: dict[str, Any] = {
        "fqn": item.index.fqn,
        "offset": list(item.index.offset) if item.index.offset is not None else None,
        "index": item.index.index,
        "type": item.type.name,
        "at": offset,
        "nbytes": nbytes,
    }
    if item.tensor_data is not None:
        td = item.tensor_data
        out["dtype"] = str(td.properties.dtype).removeprefix("torch.")
        out["size"] = list(td.size)
        out["chunk_offsets"] = list(td.chunk.offsets)
        out["chunk_sizes"] = list(td.chunk.sizes)
    return out


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _index(fqn: Any, offset: Any, index: Any) -> MetadataIndex:
    if not isinstance(fqn, str):
        raise ValueError("fqn must be a string")
    return MetadataIndex(
        fqn, torch.Size(int(x) for x in offset) if offset is not None else None, index
    )


def item_from_json(d: dict[str, Any]) -> WriteItem:
    """Rebuild a write item in the writer process (validated field by field)."""
    kind = WriteItemType[str(d["type"])]
    tensor_data = None
    if kind != WriteItemType.BYTE_IO:
        tensor_data = TensorWriteData(
            chunk=ChunkStorageMetadata(
                offsets=torch.Size(int(x) for x in d["chunk_offsets"]),
                sizes=torch.Size(int(x) for x in d["chunk_sizes"]),
            ),
            properties=TensorProperties(dtype=_dtype(d["dtype"])),
            size=torch.Size(int(x) for x in d["size"]),
        )
    return WriteItem(
        index=_index(d["fqn"], d["offset"], d.get("index")), type=kind, tensor_data=tensor_data
    )


def result_to_json(result: WriteResult) -> dict[str, Any]:
    """Describe a write result (where an item landed in which file)."""
    info = result.storage_data
    return {
        "fqn": result.index.fqn,
        "offset": list(result.index.offset) if result.index.offset is not None else None,
        "index": result.index.index,
        "size_in_bytes": result.size_in_bytes,
        "path": info.relative_path,
        "file_offset": info.offset,
        "length": info.length,
        "transforms": list(info.transform_descriptors) if info.transform_descriptors else None,
    }


def result_from_json(d: dict[str, Any]) -> WriteResult:
    """Rebuild a write result on the coordinator."""
    return WriteResult(
        index=_index(d["fqn"], d["offset"], d.get("index")),
        size_in_bytes=int(d["size_in_bytes"]),
        storage_data=_StorageInfo(
            str(d["path"]), int(d["file_offset"]), int(d["length"]), d.get("transforms")
        ),
    )


class _ChecksumStream(io.RawIOBase):
    """A file opened for writing that keeps a running CRC-32 of everything written."""

    def __init__(self, raw: Any, sink: dict[str, int], name: str, errors: list[OSError]) -> None:
        super().__init__()
        self._errors = errors
        self._raw = raw
        self._sink = sink
        self._name = name
        self._crc = 0
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        try:
            n = self._raw.write(view)
        except OSError as exc:  # torch.save turns it into an obscure zip error: keep it
            self._errors.append(exc)
            raise
        self._crc = zlib.crc32(view[:n], self._crc)
        self._size += n
        return int(n)

    def tell(self) -> int:
        return int(self._raw.tell())

    def flush(self) -> None:
        try:
            self._raw.flush()
        except OSError as exc:
            self._errors.append(exc)
            raise

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def close(self) -> None:
        if not self.closed:
            self._raw.flush()
            self._sink[self._name] = self._crc & 0xFFFFFFFF
            self._sink[self._name + ":size"] = self._size
        super().close()


class ChecksumFileSystem(FileSystem):
    """DCP's local file system that checksums every file while it is written."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, int] = {}
        self.errors: list[OSError] = []

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with open(path, mode) as raw:
            stream = _ChecksumStream(raw, self.sums, Path(path).name, self.errors)
            try:
                yield stream
            finally:
                stream.close()


class _ArenaPlanner:
    """The planner a writer process hands to ``write_data``: items resolve to staged data."""

    def __init__(self, data: dict[MetadataIndex, Any]) -> None:
        self._data = data

    def resolve_data(self, item: WriteItem) -> Any:
        value = self._data[item.index]
        return io.BytesIO(bytes(value)) if item.type == WriteItemType.BYTE_IO else value


def arena_items(items_json: list[dict[str, Any]], buf: Any) -> list[tuple[WriteItem, Any]]:
    """The write items of a save request, each with its data in the staging arena ``buf``.

    Raises:
        ValueError: an item lies outside the arena.
    """
    items: list[tuple[WriteItem, Any]] = []
    for d in items_json:
        item = item_from_json(d)
        at, nbytes = int(d["at"]), int(d["nbytes"])
        if at < 0 or at + nbytes > len(buf):
            raise ValueError(f"item {d['fqn']} lies outside the arena")
        if item.tensor_data is None:
            value: Any = memoryview(buf)[at : at + nbytes]
        else:
            dtype = item.tensor_data.properties.dtype
            value = _staging.tensor_at(buf, at, nbytes, dtype, d["chunk_sizes"])
        items.append((item, value))
    return items


def write_files(
    directory: Path, prefix: str, items: list[tuple[WriteItem, Any]], *, sync: bool = True
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Write this rank's items with DCP's file-system writer (fsynced when ``sync``), and
    checksum them on the fly."""
    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=sync)
    fs = ChecksumFileSystem()
    writer.fs = fs
    plan = SavePlan([item for item, _ in items], storage_data=_StoragePrefix(prefix))
    planner = _ArenaPlanner({item.index: value for item, value in items})
    try:
        results = writer.write_data(plan, planner).wait()  # type: ignore[arg-type]
    except Exception as exc:
        if fs.errors:  # the OS error (ENOSPC, EACCES...) is the cause worth reporting
            raise fs.errors[0] from exc
        raise
    files = {
        name: {"size": fs.sums[name + ":size"], "crc32": f"{crc:08x}"}
        for name, crc in fs.sums.items()
        if not name.endswith(":size")
    }
    return [result_to_json(r) for r in results], files


def write_request(request: dict[str, Any], buf: Any) -> dict[str, Any]:
    """Carry out one ``save`` request on the staging arena ``buf``; return the ``done`` reply.

    What the writer process does with each request, and what a rank does itself while its
    writer is still starting. Raises what ``arena_items`` or ``write_files`` raise.
    """
    items = arena_items(request["items"], buf)
    try:
        results, files = write_files(
            Path(request["dir"]),
            str(request["prefix"]),
            items,
            sync=bool(request.get("sync", True)),
        )
    finally:
        del items  # the arena's views go before it may be remapped
    return {"type": "done", "job": request["job"], "results": results, "files": files}


def finish(directory: Path, metadata: Metadata, results: list[list[dict[str, Any]]]) -> None:
    """Write the standard ``.metadata`` of the checkpoint (coordinator only, fsynced)."""
    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=True)
    writer.finish(metadata, [[result_from_json(r) for r in rank] for rank in results])
