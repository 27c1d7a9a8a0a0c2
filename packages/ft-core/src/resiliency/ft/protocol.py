"""The rank-monitor wire protocol: one UTF-8 JSON object per SOCK_SEQPACKET record.

Every message is a JSON object with a ``"t"`` key naming its type. Nothing is ever unpickled: a
frame is decoded with :func:`json.loads` and checked field by field against :data:`_SCHEMA` before
the monitor acts on it. A frame that is oversized, not UTF-8, not JSON, not an object, of an unknown
type or with a wrongly typed field raises :class:`~resiliency.ft.errors.ProtocolError`, which the
receiver logs and drops.

The hot frames (heartbeat, section start/end) are built from pre-encoded byte prefixes so that a
send costs a string format and one ``send`` system call.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from resiliency.ft.errors import ProtocolError

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_NAME_CHARS",
    "PROTOCOL_VERSION",
    "HotFrameDecoder",
    "decode_frame",
    "encode_frame",
    "heartbeat_frame",
    "mismatch_message",
    "section_frame_prefix",
    "validate_message",
    "version_mismatch_message",
]

#: Bumped on any incompatible change; client and monitor refuse each other when it differs.
PROTOCOL_VERSION = 1
#: The largest record either side sends or accepts (bytes of UTF-8 JSON).
MAX_FRAME_BYTES = 64 * 1024
#: The longest section name the client sends (the monitor refuses longer ones too).
MAX_NAME_CHARS = 256

_NUM = (int, float)
_OPT_INT = (int, type(None))
_OPT_NUM = (int, float, type(None))

# type -> {field: (accepted Python types, required)}. Anything not listed here is refused.
_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    # handshake
    "hello": {
        "v": ((int,), True),
        "role": ((str,), True),
        "pid": ((int,), True),
        "rank": (_OPT_INT, False),
        "local_rank": (_OPT_INT, False),
    },
    "welcome": {
        "v": ((int,), True),
        "cfg": ((dict,), True),
        "dump_path": ((str,), True),
        "timeouts": ((dict,), True),
    },
    # hot frames, rank -> monitor
    "hb": {"ts": (_NUM, True)},
    "ss": {"n": ((str,), True), "ts": (_NUM, True)},
    "se": {"n": ((str,), True), "ts": (_NUM, True)},
    "sa": {"ts": (_NUM, True)},
    "dump_ready": {},
    # cold requests, rank -> monitor
    "stats": {},
    "set_timeouts": {"heartbeat": ((dict,), True), "section": ((dict,), True)},
    "wlc": {"action": ((str,), True), "desc": ((str,), True)},
    "bye": {},
    # controller -> monitor
    "worker_started": {
        "pid": ((int,), True),
        "rank": (_OPT_INT, False),
        "restart": ((int,), False),
        "watch_startup": ((bool,), False),
    },
    "arm_startup": {},
    "worker_stopped": {},
    "dump_stacks": {},
    "watch_status": {},
    "shutdown": {},
    # responses and events, monitor -> peer
    "ok": {"stats": ((dict,), False), "forwarded": ((bool,), False), "watch": ((dict,), False)},
    "error": {"msg": ((str,), True), "code": ((str,), False)},
    "event": {
        "kind": ((str,), True),
        "local_rank": (_OPT_INT, False),
        "rank": (_OPT_INT, False),
        "pid": (_OPT_INT, False),
        "timer": ((str, type(None)), False),
        "elapsed": (_OPT_NUM, False),
        "limit": (_OPT_NUM, False),
        "stack_dump": ((str, type(None)), False),
        "signal": ((str, type(None)), False),
        "action": ((str, type(None)), False),
        "desc": ((str, type(None)), False),
        "clean": ((bool,), False),
        "msg": ((str,), False),
    },
}


def _refuse_constant(name: str) -> float:
    raise ProtocolError(f"non-finite number {name} is not allowed")


def _check_field(msg_type: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int subclass in Python; a JSON true where a number is expected is a wrong type.
    if isinstance(value, bool) and bool not in types:
        raise ProtocolError(f"field {key!r} of a {msg_type!r} frame must not be a boolean")
    if not isinstance(value, types):
        wanted = " or ".join(sorted(t.__name__ for t in types))
        raise ProtocolError(
            f"field {key!r} of a {msg_type!r} frame is {type(value).__name__}, expected {wanted}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"field {key!r} of a {msg_type!r} frame is not a finite number")


def validate_message(msg: Any) -> dict[str, Any]:
    """Check a decoded message against the schema.

    Args:
        msg: The decoded JSON value.

    Returns:
        The same message, typed as a dict.

    Raises:
        ProtocolError: It is not an object, has an unknown type, a missing, unknown or wrongly
            typed field.
    """
    if not isinstance(msg, dict):
        raise ProtocolError(f"a frame must be a JSON object, got {type(msg).__name__}")
    msg_type = msg.get("t")
    if not isinstance(msg_type, str):
        raise ProtocolError("a frame must have a string field 't' naming its type")
    fields = _SCHEMA.get(msg_type)
    if fields is None:
        raise ProtocolError(f"unknown frame type {msg_type[:40]!r}")
    for key, value in msg.items():
        if key == "t":
            continue
        spec = fields.get(key)
        if spec is None:
            raise ProtocolError(f"unknown field {key[:40]!r} in a {msg_type!r} frame")
        _check_field(msg_type, key, value, spec[0])
    for key, (_, required) in fields.items():
        if required and key not in msg:
            raise ProtocolError(f"a {msg_type!r} frame lacks the required field {key!r}")
    if msg_type in ("ss", "se") and not 0 < len(msg["n"]) <= MAX_NAME_CHARS:
        raise ProtocolError(f"section names must have 1 to {MAX_NAME_CHARS} characters")
    return msg


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode and validate one received record.

    Args:
        data: The record's bytes.

    Returns:
        The validated message.

    Raises:
        ProtocolError: The record is oversized, not UTF-8 JSON, or not a valid message.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the {MAX_FRAME_BYTES} byte limit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"frame is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        msg = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        # RecursionError: deeply nested arrays such as '[[[[...]]]]'.
        raise ProtocolError(f"frame is not valid JSON ({type(exc).__name__}: {exc})") from exc
    return validate_message(msg)


def encode_frame(msg: Mapping[str, Any]) -> bytes:
    """Validate and encode one message.

    Args:
        msg: The message, with its ``"t"`` key.

    Returns:
        The UTF-8 JSON record.

    Raises:
        ProtocolError: The message is invalid or its encoding exceeds :data:`MAX_FRAME_BYTES`.
    """
    validate_message(dict(msg))
    data = json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"a {msg['t']!r} frame of {len(data)} bytes exceeds the {MAX_FRAME_BYTES} byte limit"
        )
    return data


def heartbeat_frame(ts: float) -> bytes:
    """Build a heartbeat frame without going through :mod:`json` (hot path).

    Args:
        ts: The sender's ``time.monotonic()``.

    Returns:
        The encoded frame.
    """
    return b'{"t":"hb","ts":%.6f}' % ts


def section_frame_prefix(kind: str, name: str) -> bytes:
    """Pre-encode the constant part of a section frame; append ``b"%.6f}" % ts`` to finish it.

    Args:
        kind: ``"ss"`` (section start) or ``"se"`` (section end).
        name: The section name.

    Returns:
        The bytes up to and including ``"ts":``.

    Raises:
        ProtocolError: The kind is unknown or the name is empty, too long or not a string.
    """
    if kind not in ("ss", "se"):
        raise ProtocolError(f"unknown section frame kind {kind!r}")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise ProtocolError(
            f"section name must be a string of 1 to {MAX_NAME_CHARS} characters, got {name!r:.80}"
        )
    return b'{"t":"%s","n":%s,"ts":' % (kind.encode(), json.dumps(name).encode())


def version_mismatch_message(data: bytes) -> str | None:
    """Look for a hello from another protocol version in a frame this version cannot validate.

    A newer client may add hello fields this version does not know; it must still be told that
    the versions differ rather than that its hello is malformed.

    Args:
        data: A frame that failed :func:`decode_frame`.

    Returns:
        The refusal message naming both versions, or None when the frame is no such hello.
    """
    try:
        msg = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError, ProtocolError):
        return None
    if not isinstance(msg, dict) or msg.get("t") != "hello":
        return None
    version = msg.get("v")
    if isinstance(version, bool) or not isinstance(version, int) or version == PROTOCOL_VERSION:
        return None
    return mismatch_message(version, PROTOCOL_VERSION)


def mismatch_message(client_version: int, monitor_version: int) -> str:
    """Return the refusal for a version mismatch, naming both versions and what to do."""
    return (
        f"protocol version mismatch: client speaks v{client_version}, monitor speaks "
        f"v{monitor_version}; install the same resiliency-ft-core on both sides"
    )


# A JSON number, exactly as json.loads accepts it (float() alone would also take "nan", "1_0").
_JSON_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_TS_KEY = b'"ts":'
_MAX_PREFIXES = 4096


class HotFrameDecoder:
    """Decode the hot frames (heartbeats, section events) without a full JSON parse.

    A hot frame is a constant prefix followed by a timestamp and ``}``. The prefix of a frame
    that passed :func:`decode_frame` is remembered; a later frame with the same prefix and a plain
    JSON number accepted here is exactly what the full decoder would accept. Anything else returns
    None, and the caller falls back to :func:`decode_frame`.
    """

    def __init__(self) -> None:
        self._prefixes: dict[bytes, tuple[str, str | None]] = {b'{"t":"hb","ts":': ("hb", None)}

    def decode(self, data: bytes) -> tuple[str, str | None, float] | None:
        """Return ``(type, section name or None, ts)``, or None when not a known hot frame."""
        head, sep, tail = data.rpartition(_TS_KEY)
        known = self._prefixes.get(head + sep)
        if (
            known is None
            or not tail.endswith(b"}")
            or not _JSON_NUMBER.fullmatch(tail, 0, len(tail) - 1)
        ):
            return None
        ts = float(tail[:-1])
        if not math.isfinite(ts):
            return None
        return known[0], known[1], ts

    def learn(self, data: bytes, msg: dict[str, Any]) -> None:
        """Remember the prefix of a validated section frame (if it has the canonical layout)."""
        if msg["t"] not in ("ss", "se") or len(self._prefixes) >= _MAX_PREFIXES:
            return
        head, sep, _ = data.rpartition(_TS_KEY)
        prefix = head + sep
        if prefix == section_frame_prefix(msg["t"], msg["n"]):
            self._prefixes[prefix] = (msg["t"], msg["n"])
