"""Wrapping existing callables (methods, functions) in detection sections, and undoing it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from resiliency.straggler.errors import StragglerConfigError

__all__ = ["CallableId", "CallableWrapper"]

_MISSING = object()


@dataclass(frozen=True)
class CallableId:
    """Names a callable attribute of an object (a class, instance or module) to time.

    The fields, their order and the section name are those of NVIDIA's resiliency extension:
    ``"<module>.<Class>.<name>"`` for a class (e.g. ``"mypkg.model.Model.forward"``),
    ``"<module>.<name>"`` for a module, ``"<Class>.<name>"`` for an instance.

    Section names never depend on the arguments of a call. ``arg_filter_fn`` and
    ``extra_args_fn`` are accepted and, as in that tool's 0.4 releases, not used by the wrapper;
    ``ignored_args`` is checked against the callable's signature.

    Attributes:
        obj: The object holding the callable.
        name: The attribute name of the callable.
        arg_filter_fn: Accepted for compatibility (``inspect.BoundArguments -> bool``); unused.
        extra_args_fn: Accepted for compatibility (``inspect.BoundArguments -> dict``); unused.
        ignored_args: Parameter names of the callable that do not affect the section.
    """

    obj: Any
    name: str
    arg_filter_fn: Callable[[inspect.BoundArguments], bool] | None = None
    extra_args_fn: Callable[[inspect.BoundArguments], dict[str, Any]] | None = None
    ignored_args: tuple[str, ...] | None = None

    def __str__(self) -> str:
        obj = self.obj
        owner: str
        if inspect.ismodule(obj):
            owner = obj.__name__
        elif inspect.isclass(obj):
            owner = f"{obj.__module__}.{obj.__name__}"
        else:
            owner = str(getattr(type(obj), "__name__", None) or getattr(obj, "__name__", obj))
        return f"{owner}.{self.name}"


def _check_ignored_args(cid: CallableId, func: Callable[..., Any]) -> None:
    if not cid.ignored_args:
        return
    try:
        params = set(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return  # builtins without a signature: nothing to check against
    params.add("self")  # bound methods drop it from the signature
    unknown = [arg for arg in cid.ignored_args if arg not in params]
    if unknown:
        raise StragglerConfigError(
            f"CallableId {cid}: ignored_args {unknown} are not parameters of the callable "
            f"(parameters: {sorted(params)})"
        )


class CallableWrapper:
    """Replaces callables with timed versions and restores the originals.

    Args:
        section_factory: Returns the context manager of a section, given its name.
    """

    def __init__(self, section_factory: Callable[[str, bool], AbstractContextManager[Any]]) -> None:
        self._section = section_factory
        # (object, attribute, raw attribute in the object's own __dict__ or _MISSING)
        self._originals: list[tuple[Any, str, Any]] = []

    def wrap(self, callable_ids: list[CallableId], profile_cuda: bool = True) -> None:
        """Wrap every callable in a section named after it.

        Args:
            callable_ids: What to wrap.
            profile_cuda: Also time the GPU work of the calls.

        Raises:
            StragglerConfigError: An attribute is missing, not callable, already wrapped, or
                ``ignored_args`` names an unknown parameter. Nothing is wrapped in that case.
        """
        plans = []
        wrapped = {(id(obj), attr) for obj, attr, _ in self._originals}
        for cid in callable_ids:
            if not isinstance(cid, CallableId):
                raise StragglerConfigError(f"wrap_callables takes CallableId objects, got {cid!r}")
            if (id(cid.obj), cid.name) in wrapped:
                raise StragglerConfigError(f"{cid} is already wrapped")
            raw = inspect.getattr_static(cid.obj, cid.name, _MISSING)
            if raw is _MISSING:
                raise StragglerConfigError(f"{cid}: the object has no attribute {cid.name!r}")
            own = (
                vars(cid.obj).get(cid.name, _MISSING) if hasattr(cid.obj, "__dict__") else _MISSING
            )
            plans.append((cid, raw, own))
            wrapped.add((id(cid.obj), cid.name))
        for cid, raw, _ in plans:
            func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            if not callable(func):
                raise StragglerConfigError(f"{cid} is not callable")
            _check_ignored_args(cid, func)
        for cid, raw, own in plans:
            # On an instance, a method found on its class must be wrapped bound to the instance:
            # the wrapper is stored in the instance's __dict__, where Python does not bind it.
            on_instance = not isinstance(cid.obj, type) and not inspect.ismodule(cid.obj)
            target = getattr(cid.obj, cid.name) if on_instance else raw
            setattr(cid.obj, cid.name, self._timed(str(cid), target, profile_cuda))
            self._originals.append((cid.obj, cid.name, own))

    def _timed(self, section_name: str, raw: Any, profile_cuda: bool) -> Any:
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        func = raw.__func__ if kind is not None else raw
        section = self._section(section_name, profile_cuda)

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with section:
                return func(*args, **kwargs)

        return kind(timed) if kind is not None else timed

    def restore(self) -> None:
        """Put every wrapped callable back as it was (inherited ones are removed again)."""
        while self._originals:
            obj, attr, own = self._originals.pop()
            if own is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, own)

    def wrapped(self) -> Iterator[tuple[Any, str]]:
        """The (object, attribute) pairs currently wrapped."""
        return ((obj, attr) for obj, attr, _ in self._originals)
