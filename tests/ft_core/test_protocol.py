"""Frame encoding, validation and the hot-frame fast path."""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resiliency.ft._proc import is_same_or_descendant, pid_alive, process_start_time
from resiliency.ft.errors import ConfigError, ProtocolError
from resiliency.ft.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    HotFrameDecoder,
    decode_frame,
    encode_frame,
    heartbeat_frame,
    section_frame_prefix,
    version_mismatch_message,
)
from resiliency.ft.socket_dir import (
    check_socket_path,
    create_socket_dir,
    ensure_private_dir,
    peer_credentials,
    socket_path_for,
)


def test_round_trip_of_every_kind_of_message():
    messages = [
        {"t": "hello", "v": 1, "role": "rank", "pid": 12, "rank": None, "local_rank": 0},
        {"t": "hb", "ts": 1.5},
        {"t": "ss", "n": "step", "ts": 2},
        {"t": "wlc", "action": "ShutdownWorkload", "desc": "é"},
        {"t": "event", "kind": "hang", "timer": "section:step", "elapsed": 1.2, "limit": 1.0},
        {"t": "error", "msg": "no", "code": "version"},
    ]
    for msg in messages:
        assert decode_frame(encode_frame(msg)) == msg


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\xff", "not valid UTF-8"),
        (b"{", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"t":1}', "string field 't'"),
        (b'{"t":"zz"}', "unknown frame type 'zz'"),
        (b'{"t":"hb"}', "lacks the required field 'ts'"),
        (b'{"t":"hb","ts":"x"}', "field 'ts' of a 'hb' frame is str"),
        (b'{"t":"hb","ts":true}', "must not be a boolean"),
        (b'{"t":"hb","ts":NaN}', "non-finite"),
        (b'{"t":"hb","ts":1e400}', "not a finite number"),
        (b'{"t":"hb","ts":1,"x":2}', "unknown field 'x'"),
        (b'{"t":"ss","n":"","ts":1}', "section names must have 1 to 256"),
        (b"[" * 100000, "exceeds the 65536 byte limit"),
        (b"[" * 30000, "not valid JSON"),
    ],
)
def test_invalid_frames_raise_protocol_error(frame, message):
    with pytest.raises(ProtocolError, match=message):
        decode_frame(frame)


def test_encode_refuses_oversized_and_invalid_messages():
    with pytest.raises(ProtocolError, match="exceeds"):
        encode_frame({"t": "error", "msg": "x" * MAX_FRAME_BYTES})
    with pytest.raises(ProtocolError):
        encode_frame({"t": "hb", "ts": math.inf})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=100).map(str.encode))
def test_decode_raises_only_protocol_errors(data):
    with contextlib.suppress(ProtocolError):
        decode_frame(data)


def test_hot_frames_built_by_the_client_decode_fully():
    assert decode_frame(heartbeat_frame(12.25)) == {"t": "hb", "ts": 12.25}
    name = 'odd "name" \\ with ünïcode'
    frame = section_frame_prefix("ss", name) + b"%.6f}" % 3.5
    assert decode_frame(frame) == {"t": "ss", "n": name, "ts": 3.5}
    with pytest.raises(ProtocolError):
        section_frame_prefix("ss", "")
    with pytest.raises(ProtocolError):
        section_frame_prefix("xx", "step")


@settings(max_examples=300, deadline=None)
@given(
    name=st.text(min_size=1, max_size=30),
    tail=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(lambda f: repr(f).encode()),
        st.sampled_from([b"1_0", b" 1", b"nan", b"Infinity", b"-0", b"1e999", b"01", b"1.", b""]),
        st.binary(max_size=8),
    ),
    suffix=st.sampled_from([b"}", b"} ", b"", b"}}"]),
)
def test_fast_path_accepts_exactly_what_the_full_decoder_accepts(name, tail, suffix):
    decoder = HotFrameDecoder()
    prefix = section_frame_prefix("ss", name)
    learned = prefix + b"1.0}"
    decoder.learn(learned, decode_frame(learned))
    for frame in (prefix + tail + suffix, heartbeat_frame(0.0)[:15] + tail + suffix):
        fast = decoder.decode(frame)
        try:
            full = decode_frame(frame)
        except ProtocolError:
            full = None
        if fast is not None:
            assert full is not None
            assert (fast[0], fast[1], fast[2]) == (full["t"], full.get("n"), full["ts"])


def test_version_mismatch_message_names_both_versions():
    frame = json.dumps({"t": "hello", "v": 7, "role": "rank", "pid": 1, "future": True}).encode()
    message = version_mismatch_message(frame)
    assert message is not None
    assert f"client speaks v7, monitor speaks v{PROTOCOL_VERSION}" in message
    assert version_mismatch_message(b"garbage") is None
    assert version_mismatch_message(b'{"t":"hello","v":1}') is None


def test_peer_credentials_of_a_socketpair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        creds = peer_credentials(a)
    assert (creds.pid, creds.uid, creds.gid) == (os.getpid(), os.geteuid(), os.getegid())


def test_socket_dir_helpers(tmp_path):
    directory = create_socket_dir("ft-unit-")
    try:
        assert ensure_private_dir(directory) == directory
        assert socket_path_for(directory, 3).name == "rank-3.sock"
    finally:
        directory.rmdir()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o750)
    with pytest.raises(ConfigError, match="mode 0750"):
        ensure_private_dir(open_dir)
    with pytest.raises(ConfigError, match="Set TMPDIR to a shorter directory"):
        check_socket_path("/tmp/" + "d" * 110)


def test_process_helpers_tell_children_zombies_and_strangers_apart():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = process_start_time(child.pid)
        assert start is not None
        assert pid_alive(child.pid, start)
        assert not pid_alive(child.pid, start + 1)  # a reused pid has another start time
        assert is_same_or_descendant(child.pid, os.getpid())
        assert not is_same_or_descendant(os.getpid(), child.pid)
        child.kill()
        deadline = time.monotonic() + 5
        while pid_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(child.pid)  # killed but not reaped yet: a zombie counts as gone
    finally:
        child.kill()
        child.wait(5)
    assert not pid_alive(child.pid)
