"""``Compose``: chain callbacks of one kind (abort, finalize, health check, rank assignment)."""

from __future__ import annotations

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

    Args:
        *instances: callables that take one argument and return the value for the next one.

    Raises:
        ConfigError: no callable given, or one of them is not callable.
    """

    instances: tuple[Callable[[Any], Any], ...]

    def __new__(cls, *instances: Callable[[Any], Any]) -> Compose:
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

    def __call__(self, value: Any) -> Any:
        """Call the last callable first, each on the previous one's result."""
        for instance in reversed(self.instances):
            value = instance(value)
        return value
