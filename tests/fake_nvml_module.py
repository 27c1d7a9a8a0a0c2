"""Load the tests' one fake ``pynvml`` (fake_nvml/pynvml.py) in process, for a test's duration."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

FAKE_DIR = Path(__file__).parent / "fake_nvml"


def load_fake_pynvml(monkeypatch: pytest.MonkeyPatch, count: int = 2) -> ModuleType:
    """A fresh fake ``pynvml`` with ``count`` healthy GPUs, what ``import pynvml`` then gives."""
    monkeypatch.delenv("FAKE_NVML_STATE", raising=False)
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)  # before exec: its dataclasses need it
    spec.loader.exec_module(module)
    module.configure(count)
    return module
