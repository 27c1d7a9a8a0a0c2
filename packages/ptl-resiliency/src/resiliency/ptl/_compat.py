"""One place that knows the two import paths of Lightning.

Lightning ships the same trainer as ``lightning.pytorch`` (the unified ``lightning`` package) and as
``pytorch_lightning`` (the standalone package). The two are separate copies of the code: a callback
that subclasses one ``Callback`` is not an instance of the other. When both are installed, our
callbacks subclass both base classes, so they work with either ``Trainer``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["CallbackBase", "checkpoint_callback_types", "early_stopping_types"]

_MODULE_NAMES = ("lightning.pytorch", "pytorch_lightning")


def _available_modules() -> list[ModuleType]:
    modules = []
    for name in _MODULE_NAMES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    if not modules:
        raise ImportError(
            "resiliency.ptl needs Lightning: install `lightning` (or `pytorch_lightning`) >= 2.2"
        )
    return modules


_MODULES = _available_modules()


def checkpoint_callback_types() -> tuple[Any, ...]:
    """Return ``ModelCheckpoint`` from every installed Lightning flavour (for ``isinstance``)."""
    return tuple(m.callbacks.ModelCheckpoint for m in _MODULES)


def early_stopping_types() -> tuple[Any, ...]:
    """Return ``EarlyStopping`` from every installed Lightning flavour (for ``isinstance``)."""
    return tuple(m.callbacks.EarlyStopping for m in _MODULES)


if TYPE_CHECKING:
    from lightning.pytorch import Callback as CallbackBase
else:
    _bases: tuple[Any, ...] = tuple(m.Callback for m in _MODULES)
    CallbackBase = _bases[0] if len(_bases) == 1 else type("CallbackBase", _bases, {})
