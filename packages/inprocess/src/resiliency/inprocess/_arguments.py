"""Validation of ``Wrapper``'s arguments: types, the order of the timeouts, unknown names."""

from __future__ import annotations

import difflib
import logging
import warnings
from datetime import timedelta
from typing import Any

from resiliency.inprocess.abort import Abort
from resiliency.inprocess.completion import Completion
from resiliency.inprocess.compose import Compose
from resiliency.inprocess.exception import ConfigError
from resiliency.inprocess.finalize import Finalize
from resiliency.inprocess.health_check import HealthCheck
from resiliency.inprocess.initialize import Initialize, RetryController
from resiliency.inprocess.rank_assignment import RankAssignment, Tree
from resiliency.inprocess.rank_filter import RankFilter
from resiliency.inprocess.terminate import Terminate

log = logging.getLogger(__name__)

TIMEDELTAS = (
    "monitor_thread_interval",
    "monitor_process_interval",
    "heartbeat_interval",
    "progress_watchdog_interval",
    "soft_timeout",
    "hard_timeout",
    "heartbeat_timeout",
    "barrier_timeout",
    "completion_timeout",
    "last_call_wait",
    "termination_grace_time",
)

# NVRx's own order constraints (each pair: the first must be shorter than the second).
ORDER = (
    ("soft_timeout", "hard_timeout"),
    ("hard_timeout", "barrier_timeout"),
    ("monitor_process_interval", "barrier_timeout"),
    ("heartbeat_timeout", "barrier_timeout"),
    ("heartbeat_interval", "heartbeat_timeout"),
    ("monitor_process_interval", "heartbeat_timeout"),
    ("monitor_process_interval", "soft_timeout"),
    ("monitor_thread_interval", "soft_timeout"),
    ("progress_watchdog_interval", "soft_timeout"),
)

STORE_KWARGS = ("host_name", "port", "timeout")

# The callback arguments and the NVRx base class each must be an instance of (or None).
CALLBACKS = {
    "initialize": Initialize,
    "abort": Abort,
    "finalize": Finalize,
    "health_check": HealthCheck,
    "rank_filter": RankFilter,
    "completion": Completion,
    "terminate": Terminate,
}


def check_all(values: dict[str, Any], unknown: dict[str, Any], known: tuple[str, ...]) -> None:
    """Check every argument of ``Wrapper``; warn for the deprecated ``rank_filter``.

    Args:
        values: the arguments by name.
        unknown: keyword arguments ``Wrapper`` does not take.
        known: the names it takes.

    Raises:
        ConfigError: the first wrong argument, named, with what it expects.
    """
    reject_unknown(unknown, known)
    check_timedeltas(values)
    check_store(values["store_factory"], values["store_kwargs"])
    for name, base in CALLBACKS.items():
        check_callback(name, values[name], base)
    check_rank_assignment(values["rank_assignment"])
    if not isinstance(values["enabled"], bool):
        raise ConfigError(f"Wrapper(enabled={values['enabled']!r}): expected True or False")
    check_path("monitor_process_logfile", values["monitor_process_logfile"])
    check_path("monitor_process_pidfile", values["monitor_process_pidfile"])
    if values["rank_filter"] is not None:
        warnings.warn(  # stacklevel: the caller of Wrapper()
            "Wrapper(rank_filter=...) is deprecated, as in NVRx 0.4: use rank_assignment "
            "(rank_assignment.MaxActiveWorldSize, ActiveWorldSizeDivisibleBy)",
            DeprecationWarning,
            stacklevel=3,
        )


def reject_unknown(unknown: dict[str, Any], known: tuple[str, ...]) -> None:
    """Raise for keyword arguments ``Wrapper`` does not take, naming the closest valid one.

    Raises:
        ConfigError: an unknown or unsupported argument was passed.
    """
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"Wrapper() got an unknown argument {name!r}{hint}")


def check_timedeltas(values: dict[str, Any]) -> None:
    """Check every interval and timeout is a positive ``timedelta``, in NVRx's order.

    Raises:
        ConfigError: a wrong type, a negative value, or two timeouts in the wrong order.
    """
    for name in TIMEDELTAS:
        value = values[name]
        if not isinstance(value, timedelta):
            raise ConfigError(
                f"Wrapper({name}={value!r}): expected a datetime.timedelta, e.g. "
                f"{name}=timedelta(seconds={value if isinstance(value, int | float) else 1})"
            )
        if value < timedelta(0):
            raise ConfigError(f"Wrapper({name}={value}): must not be negative")
    for shorter, longer in ORDER:
        if not values[shorter] < values[longer]:
            raise ConfigError(
                f"Wrapper: {shorter} ({values[shorter].total_seconds():g} s) must be shorter "
                f"than {longer} ({values[longer].total_seconds():g} s)"
            )


def check_callback(name: str, value: Any, base: type, *, optional: bool = True) -> None:
    """Check a callback argument is an instance of its NVRx base class (or None).

    Raises:
        ConfigError: the value is of the wrong kind.
    """
    if value is None and optional:
        return
    if not isinstance(value, base):
        raise ConfigError(
            f"Wrapper({name}={value!r}): expected an instance of "
            f"resiliency.inprocess.{base.__module__.rsplit('.', 1)[-1]}.{base.__name__}"
            f"{' or None' if optional else ''} (compose several with inprocess.Compose)"
        )


def check_rank_assignment(value: Any) -> None:
    """Check ``rank_assignment``: a ``RankAssignment`` or None, with a ``Tree`` only alone.

    Raises:
        ConfigError: another type, or a ``Tree`` inside a ``Compose``.
    """
    check_callback("rank_assignment", value, RankAssignment)
    if isinstance(value, Compose) and any(isinstance(part, Tree) for part in value.instances):
        raise ConfigError(
            "Wrapper(rank_assignment=Compose(..., Tree(...), ...)): a Tree assigns and "
            "activates every rank itself and is used alone, as in NVRx; pass the Tree "
            "(its world_size_filter limits the active world size)"
        )


def check_path(name: str, value: Any) -> None:
    """Check ``monitor_process_logfile`` or ``monitor_process_pidfile``: a path (``{rank}``
    allowed) or None.

    Raises:
        ConfigError: another type.
    """
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"Wrapper({name}={value!r}): expected a str (a path) or None")


def repeat_limit(value: Any, initialize: Any) -> int | None:
    """Check ``max_repeated_faults`` and resolve its default.

    ``"auto"`` (the default) is 3, unless ``initialize`` already bounds the iterations with a
    ``RetryController(max_iterations=N)`` (alone or inside a ``Compose``): then the user chose
    how often a failure is retried, as in NVRx, and the stop rule is off unless it is asked for
    with a number.

    Returns:
        The limit, or None for no limit.

    Raises:
        ConfigError: another type, or a negative number.
    """
    if value == "auto":
        return None if _bounds_iterations(initialize) else 3
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"Wrapper(max_repeated_faults={value!r}): expected a whole number of attempts, "
            "'auto' (the default: 3 unless a RetryController bounds max_iterations), or None "
            "to restart a repeated fault without limit"
        )
    return value


def _bounds_iterations(initialize: Any) -> bool:
    """Whether ``initialize`` is, or composes, a ``RetryController`` with ``max_iterations``."""
    if isinstance(initialize, Compose):  # before RetryController: a Compose of them is one
        return any(map(_bounds_iterations, initialize.instances))
    return isinstance(initialize, RetryController) and initialize.max_iterations is not None


def check_store(store_factory: Any, store_kwargs: dict[str, Any] | None) -> None:
    """Check the store factory and the keyword arguments of the built-in store (anything goes
    for a custom factory's).

    Raises:
        ConfigError: a factory that is not callable, keyword arguments that are not a dict, or
            an unknown key for the built-in store.
    """
    if store_factory is not None and not callable(store_factory):
        raise ConfigError(f"Wrapper(store_factory={store_factory!r}): expected a callable")
    if store_kwargs is None:
        return
    if not isinstance(store_kwargs, dict):
        raise ConfigError(f"Wrapper(store_kwargs={store_kwargs!r}): expected a dict or None")
    if store_factory is not None:
        return
    for key in store_kwargs:
        if key not in STORE_KWARGS:
            close = difflib.get_close_matches(key, STORE_KWARGS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"Wrapper(store_kwargs): unknown key {key!r} for the built-in store "
                f"(valid: {', '.join(STORE_KWARGS)}){hint}"
            )
