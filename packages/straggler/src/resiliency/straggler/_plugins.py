"""Discovery of kernel-profiler plug-ins through the entry-point group.

A plug-in is skipped, with one warning each, when it cannot be loaded, when its ``API_VERSION`` is
not the one this release implements, when its factory fails (no GPU, no CUPTI), or when what the
factory returns is not a :class:`~resiliency.straggler.profiler.KernelProfiler`. The first plug-in,
by entry-point name, that passes all of these is used. The environment variable
``RESILIENCY_STRAGGLER_KERNEL_PROFILER`` picks one plug-in by name, or disables all with ``none``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from resiliency.straggler.profiler import API_VERSION, ENTRY_POINT_GROUP, KernelProfiler

__all__ = ["SELECT_ENV", "LoadedProfiler", "load_kernel_profiler"]

log = logging.getLogger(__name__)

SELECT_ENV = "RESILIENCY_STRAGGLER_KERNEL_PROFILER"


@dataclass(frozen=True)
class LoadedProfiler:
    """A working plug-in and where it came from.

    Attributes:
        profiler: The profiler the plug-in's factory returned.
        name: Entry-point name.
        target: The entry point's ``module:attribute``.
    """

    profiler: KernelProfiler
    name: str
    target: str


def _describe(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    origin = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"kernel-profiler plug-in {ep.name!r} ({ep.value}{origin})"


def _candidates() -> list[EntryPoint]:
    unique: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        unique.setdefault(ep.name, ep)  # the same distribution may be visible twice on sys.path
    found = [unique[name] for name in sorted(unique)]
    wanted = os.environ.get(SELECT_ENV, "").strip()
    if not wanted:
        return found
    if wanted.lower() == "none":
        log.info("%s=none: kernel-profiler plug-ins disabled", SELECT_ENV)
        return []
    chosen = [ep for ep in found if ep.name == wanted]
    if not chosen:
        log.warning(
            "%s=%r names no installed kernel-profiler plug-in (installed: %s); using none",
            SELECT_ENV,
            wanted,
            ", ".join(sorted(unique)) or "none",
        )
    return chosen


def _try(ep: EntryPoint) -> KernelProfiler | None:
    what = _describe(ep)
    try:
        factory = ep.load()
    except Exception as exc:
        log.warning(
            "%s could not be imported and is skipped: %s: %s", what, type(exc).__name__, exc
        )
        return None
    version = getattr(factory, "API_VERSION", None)
    if isinstance(version, bool) or not isinstance(version, int):
        log.warning(
            "%s has no integer API_VERSION (found %r) and is skipped; this resiliency-straggler "
            "implements API_VERSION %d",
            what,
            version,
            API_VERSION,
        )
        return None
    if version != API_VERSION:
        log.warning(
            "%s implements kernel-profiler API_VERSION %d but this resiliency-straggler supports "
            "only %d; the plug-in is skipped. Install versions of the two that match.",
            what,
            version,
            API_VERSION,
        )
        return None
    try:
        profiler = factory()
    except Exception as exc:
        log.warning(
            "%s failed to start and is skipped (falling back to CUDA events or CPU timing): %s: %s",
            what,
            type(exc).__name__,
            exc,
        )
        return None
    if not isinstance(profiler, KernelProfiler):
        log.warning(
            "%s returned %s, which lacks the KernelProfiler methods; skipped",
            what,
            type(profiler).__name__,
        )
        return None
    return profiler


def load_kernel_profiler() -> LoadedProfiler | None:
    """Find, check and start the first usable kernel-profiler plug-in.

    Returns:
        The loaded plug-in, or ``None`` when none is installed or none is usable (each unusable
        one logged a warning).
    """
    for ep in _candidates():
        profiler = _try(ep)
        if profiler is not None:
            log.info("GPU kernel timing through %s", _describe(ep))
            return LoadedProfiler(profiler=profiler, name=ep.name, target=ep.value)
    return None
