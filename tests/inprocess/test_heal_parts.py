"""The parts of healing that need no process group: the wire format and the plan.

The transfers themselves run between real gloo ranks in test_heal.py.
"""

from __future__ import annotations

import pytest
import torch

from resiliency.inprocess import Healer, HealError
from resiliency.inprocess._heal_codec import crc32, digest, pack, unpack
from resiliency.inprocess._heal_faults import HEAL_FAULT_ENV, maybe_corrupt
from resiliency.inprocess._heal_plan import NO_STEP, Plan, agree, assign, check_digests
from resiliency.inprocess.exception import ConfigError


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_a_model_and_adam_round_trip_bit_for_bit_without_pickle() -> None:
    model, opt = trained()
    extra = {"tuple": (1, 2.5, None, True), 7: [torch.tensor(True), torch.zeros(0, 2)]}
    buffer = pack({"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra})
    state = unpack(buffer)
    assert state["extra"] == {
        "tuple": (1, 2.5, None, True),
        7: [torch.tensor(True), state["extra"][7][1]],
    }
    other, other_opt = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)), None
    other_opt = torch.optim.Adam(other.parameters())
    other.load_state_dict(state["model"])
    other_opt.load_state_dict(state["optimizer"])
    assert other_opt.param_groups[0]["betas"] == (0.8, 0.99)
    again = pack({"model": other.state_dict(), "optimizer": other_opt.state_dict(), "extra": extra})
    assert crc32(again) == crc32(buffer) and torch.equal(again, buffer)
    # a source's checksum, taken without packing, is the packed buffer's
    assert digest(state) == (crc32(buffer), buffer.numel())


def test_a_value_that_is_not_plain_data_is_refused_by_path() -> None:
    with pytest.raises(HealError, match=r"state\['opt'\]\['fn'\] is a object"):
        pack({"opt": {"fn": object()}})


def test_a_malformed_buffer_is_a_heal_error_not_a_crash() -> None:
    buffer = pack({"m": {"w": torch.ones(3)}})
    with pytest.raises(HealError, match="cannot be decoded"):
        unpack(buffer[:-16])
    with pytest.raises(HealError, match="cannot be decoded"):
        unpack(torch.zeros(64, dtype=torch.uint8))


def test_a_flipped_byte_changes_the_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = pack({"m": {"w": torch.arange(100.0)}})
    monkeypatch.setenv(HEAL_FAULT_ENV, "corrupt@3")
    assert maybe_corrupt(buffer, 2) is buffer
    bad = maybe_corrupt(buffer, 3)
    assert crc32(bad) != crc32(buffer) and bad.numel() == buffer.numel()
    assert maybe_corrupt(buffer, 3) is buffer  # each entry fires once per process


def test_the_newest_consistent_step_wins_and_everyone_else_receives() -> None:
    assert agree([6, NO_STEP, 6, 5]) == Plan(6, [0, 2], [1, 3])
    assert agree([4, 4]) == Plan(4, [0, 1], [])
    with pytest.raises(HealError, match="no rank of the 3 holds a consistent state"):
        agree([NO_STEP] * 3)


def test_a_source_whose_copy_differs_from_the_majority_is_healed_too() -> None:
    plan, ref = check_digests(Plan(6, [0, 1, 2], [3]), [(1, 9), (1, 9), (2, 9), (-1, -1)])
    assert ref == (1, 9) and plan == Plan(6, [0, 1], [2, 3])
    with pytest.raises(HealError, match="hold different states and none is a majority"):
        check_digests(Plan(6, [0, 1], [2]), [(1, 9), (2, 9), (-1, -1)])


def test_each_receiver_tries_each_source_once_then_a_clear_error() -> None:
    assert assign([1, 3], [0, 2], {}, 6) == {1: 0, 3: 2}
    assert assign([1], [0, 2], {1: {0}}, 6) == {1: 2}
    with pytest.raises(HealError, match=r"rank 1 could not be healed to step 6: .*ranks \[0, 2\]"):
        assign([1], [0, 2], {1: {0, 2}}, 6)


def test_updating_marks_the_state_half_updated_until_the_block_ends() -> None:
    model, opt = trained()
    healer = Healer({"model": model, "optimizer": opt}, step=3)
    with healer.updating(4):
        assert healer.step is None
    assert healer.step == 4
    with pytest.raises(RuntimeError), healer.updating(5):
        raise RuntimeError("fault inside the optimizer step")
    assert healer.step is None
    with pytest.raises(ConfigError, match="expected an object with state_dict"):
        Healer({"x": 3})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"Healer\(step=-1\): expected an integer >= 0"):
        Healer({"model": model}, step=-1)
