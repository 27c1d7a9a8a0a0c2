"""Which device a group's collectives take, from its backend string (as torch reports it)."""

from __future__ import annotations

import pytest

from resiliency.ft._distributed import collective_device_type


@pytest.mark.parametrize(
    ("backend", "device"),
    [
        ("gloo", "cpu"),
        ("nccl", "cuda"),
        ("cuda:nccl", "cuda"),
        ("cpu:gloo,cuda:nccl", "cpu"),
        ("cuda:nccl,cpu:gloo", "cpu"),
        ("mpi", "cpu"),
    ],
)
def test_collective_device_type(backend: str, device: str) -> None:
    assert collective_device_type(backend) == device
