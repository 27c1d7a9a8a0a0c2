"""DCP save plans as JSON: a ``SavePlan`` to a JSON-serializable dict and back, field by field.

Plans cross ranks while a save is planned, and nothing that crosses a process boundary is
unpickled (ARCHITECTURE decision 1). The codec knows exactly what ``DefaultSavePlanner`` and
``FileSystemWriter.prepare_global_plan`` put in a plan (checked against torch 2.13): write items
with their tensor chunk and properties, the file-system writer's ``_StoragePrefix``, the
planner's flattening mappings (flattened fqn -> the original path) and ``usable``. Anything else
(another type, a field a newer torch added and set) is a ``ValueError`` that names the field, so
nothing is dropped silently. Decoding validates every field the same way: the dict came from
another process.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    BytesIOWriteData,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

try:  # the file-system writer's storage record (private in every torch 2.x)
    from torch.distributed.checkpoint.filesystem import _StoragePrefix
except ImportError as exc:  # pragma: no cover - only on a torch that renamed it
    raise ImportError(
        f"resiliency.checkpoint needs DCP's _StoragePrefix; torch {torch.__version__} moved it: "
        f"{exc}"
    ) from exc

_T = TypeVar("_T")

# The dataclass fields the codec carries, per class; see _check_instance for the others.
_KNOWN: dict[type, frozenset[str]] = {
    SavePlan: frozenset({"items", "storage_data", "planner_data", "usable"}),
    WriteItem: frozenset({"index", "type", "bytes_io_data", "tensor_data"}),
    MetadataIndex: frozenset({"fqn", "offset", "index"}),
    TensorWriteData: frozenset({"chunk", "properties", "size"}),
    ChunkStorageMetadata: frozenset({"offsets", "sizes"}),
    TensorProperties: frozenset(
        {"dtype", "layout", "requires_grad", "memory_format", "pin_memory"}
    ),
    BytesIOWriteData: frozenset({"nbytes"}),
    _StoragePrefix: frozenset({"prefix"}),
}
# Fields a newer torch may have added: carried only while they hold their default.
_UNKNOWN = {
    cls: tuple(f for f in dataclasses.fields(cls) if f.name not in known)
    for cls, known in _KNOWN.items()
}


def encode_plan(plan: SavePlan) -> dict[str, Any]:
    """A JSON-serializable description of a DCP save plan.

    Args:
        plan: A local, global or final plan of ``DefaultSavePlanner`` with the file-system
            writer's storage data (or none).

    Returns:
        A dict of JSON types only; ``decode_plan`` gives back an equal plan.

    Raises:
        ValueError: A field holds something the codec does not know; the message names it.
    """
    _check_instance(plan, SavePlan, "plan")
    return {
        "items": [_encode_item(item, f"items[{i}]") for i, item in enumerate(_list(plan.items))],
        "storage_data": _encode_storage(plan.storage_data),
        "planner_data": _encode_mappings(plan.planner_data),
        "usable": _bool(plan.usable, "usable"),
    }


def decode_plan(d: Any) -> SavePlan:
    """Rebuild a save plan from ``encode_plan``'s dict, validating every field.

    Args:
        d: The dict, as parsed from JSON that another process sent.

    Returns:
        The plan, equal to the one encoded (tuples, ``torch.Size`` and dtypes restored).

    Raises:
        ValueError: A field is missing, unknown or of the wrong type; the message names it.
    """
    _keys(d, {"items", "storage_data", "planner_data", "usable"}, "plan")
    items = d["items"]
    if type(items) is not list:
        raise ValueError(f"plan.items: expected a list, got {type(items).__name__}")
    storage = d["storage_data"]
    if storage is not None:
        _keys(storage, {"prefix"}, "storage_data")
        storage = _StoragePrefix(_str(storage["prefix"], "storage_data.prefix"))
    return SavePlan(
        items=[_decode_item(item, f"items[{i}]") for i, item in enumerate(items)],
        storage_data=storage,
        planner_data=_decode_mappings(d["planner_data"]),
        usable=_bool(d["usable"], "usable"),
    )


# --------------------------------------------------------------------------- encoding


def _encode_item(item: WriteItem, where: str) -> dict[str, Any]:
    _check_instance(item, WriteItem, where)
    _check_instance(item.index, MetadataIndex, f"{where}.index")
    if type(item.type) is not WriteItemType:
        raise ValueError(f"{where}.type: expected a WriteItemType, got {item.type!r}")
    nbytes = None
    if item.bytes_io_data is not None:
        _check_instance(item.bytes_io_data, BytesIOWriteData, f"{where}.bytes_io_data")
        nbytes = _int(item.bytes_io_data.nbytes, f"{where}.bytes_io_data.nbytes")
    index = item.index
    return {
        "fqn": _str(index.fqn, f"{where}.index.fqn"),
        "offset": None if index.offset is None else _ints(index.offset, f"{where}.index.offset"),
        "index": None if index.index is None else _int(index.index, f"{where}.index.index"),
        "type": item.type.name,
        "bytes_io_data": nbytes,
        "tensor_data": _encode_tensor(item.tensor_data, f"{where}.tensor_data"),
    }


def _encode_tensor(td: TensorWriteData | None, where: str) -> dict[str, Any] | None:
    if td is None:
        return None
    _check_instance(td, TensorWriteData, where)
    _check_instance(td.chunk, ChunkStorageMetadata, f"{where}.chunk")
    props = td.properties
    _check_instance(props, TensorProperties, f"{where}.properties")
    return {
        "offsets": _ints(td.chunk.offsets, f"{where}.chunk.offsets"),
        "sizes": _ints(td.chunk.sizes, f"{where}.chunk.sizes"),
        "size": _ints(td.size, f"{where}.size"),
        "dtype": _torch_name(props.dtype, torch.dtype, f"{where}.properties.dtype"),
        "layout": _torch_name(props.layout, torch.layout, f"{where}.properties.layout"),
        "requires_grad": _bool(props.requires_grad, f"{where}.properties.requires_grad"),
        "memory_format": _torch_name(
            props.memory_format, torch.memory_format, f"{where}.properties.memory_format"
        ),
        "pin_memory": _bool(props.pin_memory, f"{where}.properties.pin_memory"),
    }


def _encode_storage(storage: Any) -> dict[str, str] | None:
    if storage is None:
        return None
    _check_instance(storage, _StoragePrefix, "storage_data")
    return {"prefix": _str(storage.prefix, "storage_data.prefix")}


def _encode_mappings(mappings: Any) -> dict[str, list[str | int]] | None:
    if mappings is None:
        return None
    if type(mappings) is not dict:
        raise ValueError(f"planner_data: expected a dict, got {type(mappings).__name__}")
    out: dict[str, list[str | int]] = {}
    for fqn, path in mappings.items():
        where = f"planner_data[{fqn!r}]"
        if type(path) is not tuple:
            raise ValueError(f"{where}: expected a tuple, got {type(path).__name__}")
        out[_str(fqn, "planner_data key")] = [_path_part(p, where) for p in path]
    return out


def _check_instance(obj: Any, cls: type, where: str) -> None:
    """``obj`` is exactly a ``cls``, and any field the codec does not carry holds its default."""
    if type(obj) is not cls:
        raise ValueError(f"{where}: expected {cls.__name__}, got {type(obj).__name__}")
    for field in _UNKNOWN[cls]:
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            raise ValueError(f"{where}.{field.name}: a field this codec does not know")
        if getattr(obj, field.name) != default:
            raise ValueError(f"{where}.{field.name}: a field this codec does not know is set")


def _torch_name(value: Any, kind: type, where: str) -> str:
    name = str(value).removeprefix("torch.")
    if type(value) is not kind or getattr(torch, name, None) != value:
        raise ValueError(f"{where}: expected a {kind.__name__}, got {value!r}")
    return name


# --------------------------------------------------------------------------- decoding


def _decode_item(d: Any, where: str) -> WriteItem:
    _keys(d, {"fqn", "offset", "index", "type", "bytes_io_data", "tensor_data"}, where)
    kind = _str(d["type"], f"{where}.type")
    if kind not in WriteItemType.__members__:
        raise ValueError(f"{where}.type: unknown write item type {kind!r}")
    offset, index, nbytes = d["offset"], d["index"], d["bytes_io_data"]
    return WriteItem(
        index=MetadataIndex(
            fqn=_str(d["fqn"], f"{where}.fqn"),
            offset=None if offset is None else _size(offset, f"{where}.offset"),
            index=None if index is None else _int(index, f"{where}.index"),
        ),
        type=WriteItemType[kind],
        bytes_io_data=(
            None if nbytes is None else BytesIOWriteData(_int(nbytes, f"{where}.bytes_io_data"))
        ),
        tensor_data=_decode_tensor(d["tensor_data"], f"{where}.tensor_data"),
    )


_TENSOR_KEYS = {
    "offsets",
    "sizes",
    "size",
    "dtype",
    "layout",
    "requires_grad",
    "memory_format",
    "pin_memory",
}


def _decode_tensor(d: Any, where: str) -> TensorWriteData | None:
    if d is None:
        return None
    _keys(d, _TENSOR_KEYS, where)
    return TensorWriteData(
        chunk=ChunkStorageMetadata(
            offsets=_size(d["offsets"], f"{where}.offsets"),
            sizes=_size(d["sizes"], f"{where}.sizes"),
        ),
        properties=TensorProperties(
            dtype=_torch_attr(d["dtype"], torch.dtype, f"{where}.dtype"),
            layout=_torch_attr(d["layout"], torch.layout, f"{where}.layout"),
            requires_grad=_bool(d["requires_grad"], f"{where}.requires_grad"),
            memory_format=_torch_attr(
                d["memory_format"], torch.memory_format, f"{where}.memory_format"
            ),
            pin_memory=_bool(d["pin_memory"], f"{where}.pin_memory"),
        ),
        size=_size(d["size"], f"{where}.size"),
    )


def _decode_mappings(d: Any) -> dict[str, tuple[str | int, ...]] | None:
    if d is None:
        return None
    if type(d) is not dict:
        raise ValueError(f"planner_data: expected a dict, got {type(d).__name__}")
    out: dict[str, tuple[str | int, ...]] = {}
    for fqn, path in d.items():
        where = f"planner_data[{fqn!r}]"
        if type(path) is not list:
            raise ValueError(f"{where}: expected a list, got {type(path).__name__}")
        out[fqn] = tuple(_path_part(p, where) for p in path)
    return out


def _keys(d: Any, keys: set[str], where: str) -> None:
    if type(d) is not dict:
        raise ValueError(f"{where}: expected a dict, got {type(d).__name__}")
    if set(d) != keys:
        missing, unknown = sorted(keys - set(d)), sorted(set(d) - keys)
        raise ValueError(f"{where}: missing fields {missing}, unknown fields {unknown}")


def _torch_attr(name: Any, kind: type[_T], where: str) -> _T:
    value = getattr(torch, _str(name, where), None)
    if type(value) is not kind:
        raise ValueError(f"{where}: not a torch {kind.__name__}: {name!r}")
    return value


def _size(values: Any, where: str) -> torch.Size:
    if type(values) is not list:
        raise ValueError(f"{where}: expected a list, got {type(values).__name__}")
    return torch.Size(_ints(values, where))


# --------------------------------------------------------------------------- scalars (both ways)


def _list(values: Any) -> list[Any]:
    if type(values) is not list:
        raise ValueError(f"items: expected a list, got {type(values).__name__}")
    return values


def _ints(values: Any, where: str) -> list[int]:
    if not isinstance(values, (tuple, list)):  # torch.Size is a tuple
        raise ValueError(f"{where}: expected a sequence of ints, got {type(values).__name__}")
    return [_int(v, f"{where}[{i}]") for i, v in enumerate(values)]


def _int(value: Any, where: str) -> int:
    if type(value) is not int:  # bool and NumPy integers are not what DCP puts there
        raise ValueError(f"{where}: expected an int, got {type(value).__name__}")
    return value


def _bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{where}: expected a bool, got {type(value).__name__}")
    return value


def _str(value: Any, where: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{where}: expected a str, got {type(value).__name__}")
    return value


def _path_part(value: Any, where: str) -> str | int:
    if type(value) is not str and type(value) is not int:  # JSON keeps the two apart
        raise ValueError(f"{where}: a path part must be a str or an int, got {value!r}")
    return value
