"""Which device a group's collectives take, from its backend string (as torch reports it).

straggler keeps its own copy of ft-core's rule (neither depends on a sibling); the cross-check
runs where both packages are installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from resiliency.straggler._exchange import _collective_device_type

_CASES = [
    ("gloo", "cpu"),
    ("nccl", "cuda"),
    ("cuda:nccl", "cuda"),
    ("cpu:gloo,cuda:nccl", "cpu"),
    ("cuda:nccl,cpu:gloo", "cpu"),
    ("mpi", "cpu"),
]


@pytest.mark.parametrize(("backend", "device"), _CASES)
def test_collective_device_type(backend: str, device: str) -> None:
    assert _collective_device_type(backend) == device


@pytest.mark.skipif(
    importlib.util.find_spec("resiliency.ft") is None, reason="resiliency-ft-core not installed"
)
@pytest.mark.parametrize("backend", [backend for backend, _ in _CASES])
def test_the_rule_matches_ft_core(backend: str) -> None:
    from resiliency.ft._distributed import collective_device_type  # noqa: PLC0415

    assert _collective_device_type(backend) == collective_device_type(backend)
