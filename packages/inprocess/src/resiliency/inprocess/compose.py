"""``Compose``: chain callbacks of one kind (abort, finalize, health check, rank assignment)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from resiliency.inprocess.exception import ConfigError


def _common_base(instances: tuple[Any, ...]) -> type:
    """The most derived class every instance shares (``object`` at worst)."""
    shared = set(type(instances[0]).__mro__)
    for instance in instances[1:]:
        shared &= set(type(instance).__mro__)
    return next(cls for cls in type(instances[0]).__mro__ if cls in shared)


class Compose:
    """Chain callables: ``Compose(a, b, c)(x)`` is ``a(b(c(x)))``, as in NVRx.

    The result is also an instance of the callables' closest common base class, so
    ``Compose(AbortA(), AbortB())`` passes where the wrapper expects an ``Abort``.

    The chain takes any number of arguments, as NVRx's does: each callable gets what the one
    before it returned, a tuple spread into arguments (``Compose(f, g)(1, 2)`` is ``f(*g(1, 2))``
    when ``g`` returns a tuple); a callable without parameters gets none. A callable that was
    given arguments (other than a lone ``None``) and returned ``None`` breaks the chain for the
    next one: that is a ``UserWarning``, as in NVRx. The last callable's result is returned.

    Args:
        *instances: the callables, the last one called first.

    Raises:
        ConfigError: no callable given, or one of them is not callable.
    """

    instances: tuple[Callable[..., Any], ...]

    def __new__(cls, *instances: Callable[..., Any]) -> Compose:
        if not instances:
            raise ConfigError("Compose() needs at least one callable")
        for instance in instances:
            if not callable(instance):
                raise ConfigError(f"Compose() got {instance!r}, which is not callable")
        base = _common_base(instances)
        namespace = {"__new__": object.__new__}
        try:
            bases = (cls,) if base is object or issubclass(cls, base) else (cls, base)
            composed_type = type(f"Compose[{base.__name__}]", bases, namespace)
        except TypeError:  # plain functions: their type cannot be subclassed
            composed_type = type("Compose", (cls,), namespace)
        composed: Compose = object.__new__(composed_type)
        composed.instances = tuple(instances)
        return composed

    def __init__(self, *instances: Callable[..., Any]) -> None:
        """Nothing to do (``__new__`` set everything). Defined so that Python's call of
        ``__init__`` with the chained callables never reaches the common base class's own
        ``__init__``: ``Compose(FaultCounter(), FaultCounter())`` is not a FaultCounter built
        with two callables as its arguments."""

    def __call__(self, *args: Any) -> Any:
        """Call the last callable first, each on what the previous one returned."""
        result: Any = None
        for instance in reversed(self.instances):
            result = instance(*args)
            if result is None and args and args != (None,):
                warnings.warn(
                    f"{type(self).__name__}: {instance!r} returned None for {args!r}, so the "
                    "next callable of the chain gets None",
                    UserWarning,
                    stacklevel=2,
                )
            if isinstance(result, tuple):
                args = result
            elif result is None and not _takes_arguments(instance):
                args = ()
            else:
                args = (result,)
        return result


def _takes_arguments(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` declares a parameter (a callable without any passes nothing on)."""
    try:
        return bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: assume it takes one
        return True
