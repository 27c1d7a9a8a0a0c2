"""Tell, before CUPTI is touched, whether this process can reach an NVIDIA GPU at all.

CUPTI's own answer without a driver is ``CUPTI_ERROR_UNKNOWN`` (999), which tells a user nothing;
asking the driver first turns that into "no driver" or "no visible GPU".
"""

from __future__ import annotations

import ctypes
import os

_DRIVER_LIBRARY = "libcuda.so.1"
_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100


def gpu_unavailable_reason() -> str | None:
    """Return why no NVIDIA GPU can be used from this process, or None when one can.

    Calls ``cuInit`` (which the first CUDA call of any framework does anyway) and
    ``cuDeviceGetCount`` through the driver library; loads nothing when the driver is absent.
    """
    try:
        driver = ctypes.CDLL(_DRIVER_LIBRARY)
    except OSError as exc:
        return (
            f"the NVIDIA driver library {_DRIVER_LIBRARY} could not be loaded ({exc}): "
            "this machine has no NVIDIA driver, or the container was started without GPU access"
        )
    result = driver.cuInit(0)
    if result == _CUDA_ERROR_NO_DEVICE:
        return _no_device_reason()
    if result != _CUDA_SUCCESS:
        return f"the NVIDIA driver failed to initialise (cuInit returned CUDA error {result})"
    count = ctypes.c_int(0)
    result = driver.cuDeviceGetCount(ctypes.byref(count))
    if result != _CUDA_SUCCESS:
        return f"cuDeviceGetCount returned CUDA error {result}"
    if count.value == 0:
        return _no_device_reason()
    return None


def _no_device_reason() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    return f"the NVIDIA driver is installed but no GPU is visible to this process{hint}"
