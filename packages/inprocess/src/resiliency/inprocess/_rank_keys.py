"""How ``Tree`` and ``FilterCountGroupedByKey`` exchange their ranks' keys through the store.

A key crosses processes as text: a str as it is, any other key as marked JSON (NVRx pickles its
keys; nothing crossing processes is pickled here). A store of NVRx's own protocol
(``send_key``/``get_keys``: its ``StoreMixin``, or a stand-in of it) carries them as objects.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Protocol

from resiliency.inprocess import exception
from resiliency.inprocess.exception import ConfigError
from resiliency.inprocess.state import Mode, State


class _Keyed(Protocol):
    @property
    def key_or_fn(self) -> Any: ...


def round_of(state: State) -> str:
    """Which call of the assignment this is, the same on every rank: the first (before the
    function was ever called) or the one after iteration N's restart barrier."""
    return "start" if state.mode is Mode.INITIALIZED else f"after{state.iteration}"


def wait_keys(store: Any, keys: list[str], timeout: timedelta, what: str) -> None:
    """Wait until every key is set; on timeout name the missing ones and what they are."""
    try:
        store.wait(keys, timeout)
    except Exception as exc:  # torch raises DistStoreError (a RuntimeError) or its own timeout
        missing = ", ".join(k.rsplit("/", 1)[-1] for k in keys if not store.check([k]))
        raise exception.TimeoutError(
            f"rank assignment: waited {timeout.total_seconds():.1f} s for {what}; still missing: "
            f"{missing}; are those ranks alive and calling the same rank_assignment? ({exc})"
        ) from exc


#: What a key may be: it crosses processes as JSON (NVRx pickles it; nothing is pickled here).
_KEY_TYPES = (str, int, float, bool, type(None))


def _portable(key: Any) -> Any:
    """``key`` as a JSON value (a tuple as a list).

    Raises:
        TypeError: a part of it has another type.
    """
    if isinstance(key, _KEY_TYPES):
        return key
    if isinstance(key, tuple):
        return [_portable(part) for part in key]
    raise TypeError(type(key).__name__)


def is_key_or_fn(value: Any) -> bool:
    """Whether ``value`` can be a ``key_or_fn``: a function of the State, or a constant key."""
    if callable(value):
        return True
    try:
        _portable(value)
    except TypeError:
        return False
    return True


def key_of(layer: _Keyed, state: State) -> str:
    """The rank's key at this layer, as the string every rank compares."""
    key = layer.key_or_fn(state) if callable(layer.key_or_fn) else layer.key_or_fn
    return canonical(key, state.rank)


def canonical(key: Any, rank: int | None) -> str:
    """A key as the string every rank compares: a str as it is, any other key (an int, a tuple
    of them: NVRx takes any hashable) as its JSON text, marked."""
    if isinstance(key, str):
        return key
    try:
        return "\0" + json.dumps(_portable(key))
    except TypeError as exc:
        raise ConfigError(
            f"key_or_fn returned {key!r} for rank {rank}: a key must be a str, int, float, "
            f"bool, None or a tuple of those (it is sent to the other ranks as JSON; got {exc})"
        ) from exc


def speaks_nvrx(store: Any) -> bool:
    """Whether the store carries keys and states NVRx's way (its ``StoreMixin`` methods)."""
    return all(
        callable(getattr(store, name, None))
        for name in ("send_key", "get_keys", "send_state", "get_states")
    )
