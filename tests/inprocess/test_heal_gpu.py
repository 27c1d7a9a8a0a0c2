"""Healing's device handling on a GPU, over NCCL (skipped cleanly without one).

NCCL refuses two ranks on one device, so with one GPU this is a group of one: it checks that
healing's collectives run on the rank's CUDA device (NCCL cannot send CPU tensors), and that a
CUDA model and its optimizer state (Adam, on the GPU) go through the wire format and load back
on the GPU bit for bit. The transfers between ranks are tested on gloo (test_heal.py), the same
code with the device chosen from the backend.
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from resiliency.inprocess import Healer, HealError
from resiliency.inprocess._heal_codec import crc32, pack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.fixture
def nccl_group() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=30))
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    yield
    dist.destroy_process_group()
    del store
    gc.collect()


def cuda_state(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 32).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    return model, opt


# Measured on an H200 (torch 2.11, NCCL 2.28): after destroy_process_group and the store's
# release, 3 of the group's sockets stay open in the process (NCCL's; the store's 3 close).
@pytest.mark.allow_leak("socket", reason="NCCL keeps its listening sockets after the group")
def test_a_cuda_state_heals_on_its_device_over_nccl(nccl_group: None) -> None:
    model, opt = cuda_state(0)
    healer = Healer({"model": model, "optimizer": opt}, step=3)
    result = healer.heal()  # the agreement's all-gather runs on the CUDA device
    assert (result.step, result.healed, result.receivers) == (3, False, ())
    # what a receiver does with a source's bytes: load them into its own CUDA objects
    other, other_opt = cuda_state(1)
    receiver = Healer({"model": other, "optimizer": other_opt}, step=None)
    buffer = pack({"model": model.state_dict(), "optimizer": opt.state_dict()})
    receiver._load(buffer, step=3, source=0)
    assert other.weight.is_cuda and torch.equal(other.weight, model.weight)
    assert other_opt.state_dict()["state"][0]["exp_avg"].is_cuda
    again = pack({"model": other.state_dict(), "optimizer": other_opt.state_dict()})
    assert crc32(again) == crc32(buffer)
    healer.invalidate()
    with pytest.raises(HealError, match="no rank of the 1 holds a consistent state"):
        healer.heal()
