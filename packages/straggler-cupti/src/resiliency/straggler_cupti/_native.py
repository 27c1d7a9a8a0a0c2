"""Load the CUPTI-linked native module on first use, with errors that say what to install.

The module links ``libcupti.so.*``. Importing it at package import would make ``import
resiliency.straggler_cupti`` (and so the straggler plug-in discovery) fail on a machine without
CUPTI, so it is imported only when a profiler starts.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from resiliency.straggler_cupti._errors import CuptiLibraryNotFoundError

logger = logging.getLogger(__name__)

_MODULE = "resiliency.straggler_cupti._cupti_ext"
_module: ModuleType | None = None


def cupti_module() -> ModuleType:
    """Return the native collector module, importing it on first call.

    Returns:
        The ``_cupti_ext`` extension module.

    Raises:
        CuptiLibraryNotFoundError: libcupti (or the extension itself) could not be loaded.
    """
    global _module
    if _module is not None:
        return _module
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as exc:
        raise CuptiLibraryNotFoundError(_explain_import_error(exc)) from exc
    logger.debug(
        "loaded %s (backend=%s, CUPTI API version %s)",
        _MODULE,
        module.BACKEND,
        module.cupti_version(),
    )
    _module = module
    return module


def _explain_import_error(exc: ImportError) -> str:
    text = str(exc)
    if "libcupti" in text:
        return (
            f"the CUPTI library could not be loaded ({text}). Install it into this environment "
            "with `pip install nvidia-cuda-cupti` (the CUDA 13 wheel; it is found next to this "
            "package), or add the CUDA toolkit's lib64 folder (e.g. /usr/local/cuda/lib64) to "
            "LD_LIBRARY_PATH."
        )
    return (
        f"the native module {_MODULE} could not be imported ({text}); reinstall "
        "resiliency-straggler-cupti for this Python and platform"
    )
