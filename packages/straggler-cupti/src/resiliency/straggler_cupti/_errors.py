"""The package's exceptions: one base class, one subclass per way things go wrong."""

from __future__ import annotations


class CuptiProfilerError(RuntimeError):
    """Base class of every error raised by ``resiliency.straggler_cupti``."""


class CuptiUnavailableError(CuptiProfilerError):
    """Kernels cannot be timed here: no NVIDIA driver or GPU, or a stub build."""


class CuptiLibraryNotFoundError(CuptiUnavailableError, ImportError):
    """The CUPTI shared library (``libcupti.so.*``) could not be loaded."""


class CuptiCallError(CuptiProfilerError):
    """A CUPTI call failed.

    Attributes:
        call: The CUPTI function that failed.
        code: CUPTI's result code (``CUptiResult``).
    """

    def __init__(self, message: str, *, call: str, code: int) -> None:
        super().__init__(message)
        self.call = call
        self.code = code


class ProfilerStateError(CuptiProfilerError):
    """The profiler was used out of order (``stop()`` without ``start()``, use after shutdown,
    or a second profiler while another one owns CUPTI's activity buffers)."""
