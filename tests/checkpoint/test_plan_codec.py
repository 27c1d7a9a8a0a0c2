"""Save plans as JSON: real DefaultSavePlanner plans round-trip exactly; the unknown is refused."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import _StoragePrefix
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import (
    BytesIOWriteData,
    SavePlan,
    WriteItem,
    WriteItemType,
)

from resiliency.checkpoint._dcp import plan_codec as _plan_codec
from resiliency.checkpoint._dcp.plan_codec import decode_plan, encode_plan

WORLD = 2


def _state(rank: int) -> dict[str, Any]:
    """A model + optimizer state_dict with extras; ranks share the model (as DDP replicas do)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {
            "step": 12,
            "loss": 0.25,
            "blob": b"\x00\x01raw",
            "buffer": bytearray(b"abc"),
            "tensors": {
                "half": torch.ones(3, dtype=torch.float16),
                "bf16": torch.zeros(2, 2, dtype=torch.bfloat16),
                "ids": torch.arange(5, dtype=torch.int64),
                "mask": torch.tensor([True, False]),
                "bytes": torch.tensor([1, 2], dtype=torch.uint8),
                "complex": torch.ones(2, dtype=torch.complex64),
                "scalar": torch.tensor(3.0),
            },
            "history": [1, 2.5, "three", torch.full((2,), 4.0)],
            "rank": rank,  # differs per rank: the coordinator keeps its own
        },
    }


def _planners() -> list[DefaultSavePlanner]:
    planners = []
    for rank in range(WORLD):
        planner = DefaultSavePlanner()
        planner.set_up_planner(_state(rank), storage_meta=None, is_coordinator=rank == 0)
        planners.append(planner)
    return planners


def _through_json(plan: SavePlan) -> SavePlan:
    return decode_plan(json.loads(json.dumps(encode_plan(plan))))


def _assert_same(decoded: SavePlan, plan: SavePlan) -> None:
    assert decoded == plan
    # MetadataIndex.index is left out of equality: the hints must survive too.
    assert [i.index.index for i in decoded.items] == [i.index.index for i in plan.items]
    for a, b in zip(decoded.items, plan.items, strict=True):
        assert type(a.index.offset) is type(b.index.offset)
        if b.tensor_data is not None:
            assert type(a.tensor_data.size) is torch.Size
            assert a.tensor_data.properties.dtype is b.tensor_data.properties.dtype
    if plan.planner_data is not None:
        assert list(decoded.planner_data.items()) == list(plan.planner_data.items())
        assert all(type(path) is tuple for path in decoded.planner_data.values())


def test_local_plans_round_trip_exactly() -> None:
    for planner in _planners():
        plan = planner.create_local_plan()
        assert any(type(p) is int for path in plan.planner_data.values() for p in path)
        assert {i.type.name for i in plan.items} == {"TENSOR", "BYTE_IO"}
        _assert_same(_through_json(plan), plan)


def test_global_plan_from_decoded_local_plans_is_the_same() -> None:
    planners = _planners()
    local = [p.create_local_plan() for p in planners]
    expected, expected_md = planners[0].create_global_plan(local)
    got, got_md = _planners()[0].create_global_plan([_through_json(p) for p in local])
    assert got == expected
    assert got_md == expected_md  # the .metadata rank 0 writes, its flattening mappings included


def test_central_plans_round_trip_and_finish_the_same() -> None:
    planners = _planners()
    local = [p.create_local_plan() for p in planners]
    central, _ = planners[0].create_global_plan(local)
    central = FileSystemWriter("unused").prepare_global_plan(central)
    assert [p.storage_data for p in central] == [_StoragePrefix(f"__{r}_") for r in range(WORLD)]
    assert all(p.items for p in central)  # the dedup split the replicated items
    for rank, plan in enumerate(central):
        decoded = _through_json(plan)
        _assert_same(decoded, plan)
        assert planners[rank].finish_plan(decoded) == planners[rank].finish_plan(plan)


@pytest.mark.parametrize(
    "plan",
    [
        SavePlan([], usable=False),
        SavePlan([]),
        SavePlan(
            [WriteItem(MetadataIndex("b", None, 3), WriteItemType.BYTE_IO)],
            planner_data={},
        ),
        SavePlan(
            [
                WriteItem(
                    MetadataIndex("b"),
                    WriteItemType.BYTE_IO,
                    bytes_io_data=BytesIOWriteData(17),
                )
            ]
        ),
    ],
)
def test_edge_plans_round_trip(plan: SavePlan) -> None:
    _assert_same(_through_json(plan), plan)


def _real_plan() -> SavePlan:
    return _planners()[0].create_local_plan()


def _replace_item(plan: SavePlan, **changes: Any) -> SavePlan:
    items = list(plan.items)
    items[0] = dataclasses.replace(items[0], **changes)
    return dataclasses.replace(plan, items=items)


def _replace_props(plan: SavePlan, **changes: Any) -> SavePlan:
    td = plan.items[0].tensor_data
    props = dataclasses.replace(td.properties, **changes)
    return _replace_item(plan, tensor_data=dataclasses.replace(td, properties=props))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda p: dataclasses.replace(p, storage_data="__0_"), "storage_data"),
        (lambda p: dataclasses.replace(p, storage_data=_StoragePrefix(0)), "storage_data.prefix"),
        (lambda p: dataclasses.replace(p, planner_data=[("a",)]), "planner_data"),
        (lambda p: dataclasses.replace(p, planner_data={"a": ["a"]}), "planner_data['a']"),
        (lambda p: dataclasses.replace(p, planner_data={"a": (1.5,)}), "planner_data['a']"),
        (lambda p: dataclasses.replace(p, planner_data={"a": (True,)}), "planner_data['a']"),
        (lambda p: dataclasses.replace(p, usable=1), "usable"),
        (lambda p: dataclasses.replace(p, items=tuple(p.items)), "items"),
        (lambda p: _replace_item(p, index=MetadataIndex("x", (0, 0), index=True)), "index.index"),
        (lambda p: _replace_item(p, type="TENSOR"), "items[0].type"),
        (lambda p: _replace_item(p, bytes_io_data=3), "items[0].bytes_io_data"),
        (lambda p: _replace_item(p, tensor_data=("chunk",)), "items[0].tensor_data"),
        (lambda p: _replace_props(p, layout="strided"), "properties.layout"),
        (lambda p: _replace_props(p, dtype="float32"), "properties.dtype"),
        (lambda p: _replace_props(p, pin_memory=None), "properties.pin_memory"),
    ],
)
def test_encoding_refuses_what_it_does_not_know_and_names_the_field(change, field) -> None:
    plan = change(_real_plan())
    with pytest.raises(ValueError, match=re.escape(field)):
        encode_plan(plan)


def test_a_subclass_is_refused_not_flattened() -> None:
    @dataclasses.dataclass(frozen=True)
    class Richer(SavePlan):
        more: int = 1

    with pytest.raises(ValueError, match=r"^plan: expected SavePlan, got Richer"):
        encode_plan(Richer([]))


def test_a_field_a_newer_torch_added_is_carried_only_at_its_default(monkeypatch) -> None:
    extra = next(f for f in dataclasses.fields(WriteItem) if f.name == "bytes_io_data")
    monkeypatch.setitem(_plan_codec._UNKNOWN, WriteItem, (extra,))
    item = WriteItem(MetadataIndex("b"), WriteItemType.BYTE_IO)
    encode_plan(SavePlan([item]))
    with pytest.raises(ValueError, match=r"items\[0\]\.bytes_io_data: a field this codec"):
        encode_plan(SavePlan([dataclasses.replace(item, bytes_io_data=BytesIOWriteData(1))]))


def _encoded() -> dict[str, Any]:
    return json.loads(json.dumps(encode_plan(_real_plan())))


def _tensor_item(d: dict[str, Any]) -> dict[str, Any]:
    return d["items"][0]["tensor_data"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("usable"), "plan: missing fields ['usable']"),
        (lambda d: d.update(extra=1), "plan: missing fields [], unknown fields ['extra']"),
        (lambda d: d.update(items={}), "plan.items: expected a list"),
        (lambda d: d.update(storage_data={"prefix": 1}), "storage_data.prefix: expected a str"),
        (lambda d: d.update(planner_data={"a": "a"}), "planner_data['a']: expected a list"),
        (lambda d: d.update(planner_data={"a": [None]}), "planner_data['a']: a path part"),
        (lambda d: d["items"][0].update(type="PICKLE"), "items[0].type: unknown"),
        (lambda d: d["items"][0].update(fqn=3), "items[0].fqn: expected a str"),
        (lambda d: d["items"][0].update(offset=[0, "0"]), "items[0].offset[1]"),
        (lambda d: d["items"][0].update(offset="00"), "items[0].offset: expected a list"),
        (lambda d: d["items"][0].update(index=False), "items[0].index: expected an int"),
        (lambda d: _tensor_item(d).update(dtype="Tensor"), "tensor_data.dtype: not a torch"),
        (lambda d: _tensor_item(d).update(dtype="nn"), "tensor_data.dtype: not a torch"),
        (lambda d: _tensor_item(d).update(layout="float32"), "tensor_data.layout: not a"),
        (lambda d: _tensor_item(d).update(sizes=[2.0]), "tensor_data.sizes[0]"),
        (lambda d: _tensor_item(d).pop("pin_memory"), "tensor_data: missing fields"),
    ],
)
def test_decoding_validates_every_field(change, field) -> None:
    d = _encoded()
    change(d)
    with pytest.raises(ValueError, match=re.escape(field)):
        decode_plan(d)


def test_decoding_refuses_a_non_dict() -> None:
    with pytest.raises(ValueError, match="plan: expected a dict, got list"):
        decode_plan([])
