"""Shared fixtures: GPU detection for the tests marked ``gpu``."""

from __future__ import annotations

import importlib.util

import pytest


def _gpu_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        return "no CUDA GPU is available"
    return None


GPU_SKIP_REASON = _gpu_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {GPU_SKIP_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
