"""The Lightning the tests train with: ``lightning.pytorch`` (default) or ``pytorch_lightning``.

Lightning ships the same trainer twice, as ``lightning.pytorch`` (the unified package) and as the
standalone ``pytorch_lightning``; they are separate copies of the code, and a module or callback
of one is not an instance of the other's classes. ``RESILIENCY_TEST_LIGHTNING=pytorch_lightning``
(set by the ``ptl_standalone`` nox session) makes the in-process tests, the job scripts of this
folder and the example they load train through the standalone package instead. Job subprocesses
inherit the variable.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = [
    "ENV",
    "MODULE",
    "NAME",
    "CSVLogger",
    "Callback",
    "DDPStrategy",
    "LightningModule",
    "Trainer",
    "load_example",
    "pl",
]

ENV = "RESILIENCY_TEST_LIGHTNING"
_MODULES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}

NAME = os.environ.get(ENV, "lightning")
if NAME not in _MODULES:
    raise RuntimeError(f"{ENV}={NAME!r}: expected one of {sorted(_MODULES)}")
MODULE = _MODULES[NAME]
"""The import path of the selected flavour's trainer package."""

pl = importlib.import_module(MODULE)
LightningModule = pl.LightningModule
Trainer = pl.Trainer
Callback = pl.Callback
CSVLogger = importlib.import_module(f"{MODULE}.loggers").CSVLogger
DDPStrategy = importlib.import_module(f"{MODULE}.strategies").DDPStrategy


def load_example(path: Path, name: str) -> ModuleType:
    """Load a script under ``examples/`` as module ``name``, importing the selected flavour.

    The examples import ``lightning.pytorch``, as users write them; for the standalone flavour
    that import path is pointed at ``pytorch_lightning`` (the same API under another name).
    """
    source = path.read_text(encoding="utf-8")
    if MODULE != "lightning.pytorch":
        source = source.replace("lightning.pytorch", MODULE)
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module
