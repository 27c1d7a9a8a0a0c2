"""Bad input never stops the monitor; only the job's own processes may talk to it.

Garbage and hypothesis-fuzzed frames are sent from a raw SOCK_SEQPACKET socket by a real rank
process (the only kind of peer whose frames get past the handshake); afterwards the same rank hangs
and the monitor must still catch it.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from resiliency.ft import _peer
from resiliency.ft.client import RankMonitorClient
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.control import MonitorProcess
from resiliency.ft.errors import ConfigError, MonitorRefusedError, ProtocolVersionError
from resiliency.ft.protocol import MAX_FRAME_BYTES, PROTOCOL_VERSION

pytestmark = pytest.mark.slow

GARBAGE = [
    b"",
    b"\x00",
    b"not json at all",
    b"{",
    b'{"t":"hb","ts":12',  # truncated
    b"\xff\xfe\xfa\x80 not utf-8",
    b'{"t":"ss","n":"caf\xc3","ts":1}',  # truncated multi-byte character
    b"[]",
    b"42",
    b'"a string"',
    b"null",
    b'{"t":"hb","ts":"soon"}',
    b'{"t":"hb","ts":true}',
    b'{"t":"hb","ts":NaN}',
    b'{"t":"hb","ts":1e999}',
    b'{"t":"hb","ts":' + b"9" * 5000 + b"}",
    b'{"t":"ss","n":123,"ts":1}',
    b'{"t":"ss","n":"","ts":1}',
    b'{"t":"ss","n":"' + b"x" * 300 + b'","ts":1}',
    b'{"t":"ss","ts":1}',
    b'{"t":"nope"}',
    b'{"t":5}',
    b'{"ts":1}',
    b'{"t":"hb","ts":1,"extra":1}',
    b'{"t":"worker_started","pid":1}',
    b'{"t":"shutdown"}',
    b'{"t":"hello","v":1,"role":"rank","pid":1}',
    b'{"t":"wlc","action":"Reboot","desc":"x"}',
    b'{"t":"set_timeouts","heartbeat":{},"section":{}}',
    b'{"t":"set_timeouts","heartbeat":{"initial":-1,"subsequent":null,"were_calculated":true},'
    b'"section":{"section":{},"out_of_section":null,"calculated_sections":[],'
    b'"is_out_of_section_calculated":false}}',
    b"[" * 50000,
    b"x" * (MAX_FRAME_BYTES + 1000),  # oversized: truncated by the kernel, flagged MSG_TRUNC
]

RAW_RANK = """
import base64, json, os, select, socket, sys, time

sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
sock.send(json.dumps({"t": "hello", "v": 1, "role": "rank", "pid": os.getpid()}).encode())
assert json.loads(sock.recv(70000))["t"] == "welcome"


def check_alive():
    # The monitor must still answer on this same connection.
    sock.send(b'{"t":"stats"}')
    deadline = time.monotonic() + 5.0
    while True:
        ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, "the monitor stopped answering"
        data = sock.recv(70000)
        assert data, "the monitor closed the connection"
        msg = json.loads(data)
        if msg.get("t") == "ok" and "stats" in msg:
            break
    while True:  # replies to fuzzed requests
        try:
            sock.recv(70000, socket.MSG_DONTWAIT)
        except BlockingIOError:
            break


for frame in json.loads(open(sys.argv[1]).read()):
    sock.send(base64.b64decode(frame))
check_alive()
print("garbage sent", flush=True)
{fuzz}
sock.close()

from resiliency.ft import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
client.send_heartbeat()


def hang_after_bad_frames():
    client.start_section("after_fuzz")
    time.sleep(120)


hang_after_bad_frames()
"""

FUZZ = """
from hypothesis import given, settings, strategies as st

leaves = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
)
values = st.recursive(
    leaves,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)
types = st.sampled_from(
    ["hb", "ss", "se", "sa", "dump_ready", "stats", "wlc", "set_timeouts", "bye", "hello",
     "welcome", "ok", "error", "event", "worker_started", "worker_stopped", "shutdown", "", "x"]
)
keys = st.sampled_from(
    ["ts", "n", "v", "pid", "role", "action", "desc", "heartbeat", "section", "kind", "t"]
)
typed = st.builds(
    lambda t, fields: json.dumps({"t": t, **fields}).encode(),
    types,
    st.dictionaries(keys, values, max_size=3),
)
frames = st.one_of(
    st.binary(max_size=200), values.map(lambda v: json.dumps(v).encode()), typed
)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(st.lists(frames, min_size=1, max_size=12))
def fuzz(batch):
    for frame in batch:
        sock.send(frame)
    check_alive()


fuzz()
print("fuzz done", flush=True)
"""


@pytest.mark.parametrize("fuzz", [False, True], ids=["garbage", "hypothesis"])
def test_bad_frames_do_not_stop_hang_detection(start_monitor, spawn_rank, tmp_path, fuzz):
    frames = tmp_path / "frames.json"
    frames.write_text(json.dumps([base64.b64encode(f).decode() for f in GARBAGE]))
    # The rank's first heartbeat comes after all the bad frames (and hypothesis's import and 150
    # examples): 20 s of FAST_CONFIG's initial timeout was not enough under 4 xdist workers.
    monitor = start_monitor(
        initial_rank_heartbeat_timeout=300.0,
        rank_heartbeat_timeout=None,
        rank_section_timeouts={"after_fuzz": 1.0},
    )
    code = RAW_RANK.replace("{fuzz}", FUZZ if fuzz else "")
    rank = spawn_rank(code, monitor, prelude=False, args=(str(frames),))
    hang = monitor.wait_event("hang", pid=rank.pid, timeout=300)
    assert hang.timer == "section:after_fuzz", rank.output()
    assert hang.stack_dump is not None and "hang_after_bad_frames" in hang.stack_dump
    assert monitor.wait_event("killed", pid=rank.pid).signal == "SIGTERM"
    rank.wait()
    out = rank.output()
    assert "garbage sent" in out
    if fuzz:
        assert "fuzz done" in out
    assert monitor.proc.is_alive()
    assert monitor.proc.stop() == 0
    log = monitor.log()
    assert "dropped a frame from pid" in log
    assert "unexpected error" not in log  # nothing reached the loop's last-resort handler
    if not fuzz:
        assert f"dropped {len(GARBAGE)} malformed frames in total" in log


def test_garbage_instead_of_hello_is_refused_and_monitor_keeps_serving(start_monitor, spawn_rank):
    monitor = start_monitor(rank_heartbeat_timeout=1.0)
    for payload in (b"\xff garbage", b'{"t":"hb","ts":1}', b'{"t":"hello"}'):
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
            raw.settimeout(5)
            raw.connect(str(monitor.socket_path))
            raw.send(payload)
            reply = json.loads(raw.recv(70000))
            assert reply["t"] == "error"
            assert raw.recv(70000) == b""  # closed after the refusal
    rank = spawn_rank("client.send_heartbeat()\ntime.sleep(120)\n", monitor)
    assert monitor.wait_event("hang", pid=rank.pid).timer == "heartbeat"


def test_socket_directory_and_socket_are_private(start_monitor):
    monitor = start_monitor()
    directory = monitor.socket_path.parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(monitor.socket_path.stat().st_mode) == 0o600
    assert directory.stat().st_uid == os.geteuid()


def test_monitor_refuses_a_directory_others_can_enter(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(ConfigError, match="must not be accessible to other users"):
        MonitorProcess.start(FaultToleranceConfig(), shared / "rank-0.sock", 0)


def test_socket_path_too_long_is_a_clear_error(sock_dir):
    with pytest.raises(ConfigError, match="TMPDIR"):
        MonitorProcess.start(FaultToleranceConfig(), sock_dir / ("x" * 120 + ".sock"), 0)


def test_connection_from_unexpected_pid_is_refused(start_monitor, monkeypatch):
    monitor = start_monitor()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monitor.proc.worker_started(worker.pid, rank=0)
        monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", str(monitor.socket_path))
        with pytest.raises(MonitorRefusedError) as err:
            RankMonitorClient().init_workload_monitoring()
        message = str(err.value)
        assert f"pid {os.getpid()} is neither the worker" in message
        assert f"(pid {worker.pid})" in message
        assert "refused a connection" in monitor.log()
    finally:
        worker.kill()
        worker.wait(5)


def test_protocol_version_mismatch_names_both_versions(start_monitor, monkeypatch):
    monitor = start_monitor()
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", str(monitor.socket_path))
    monkeypatch.setattr(_peer, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    with pytest.raises(ProtocolVersionError) as err:
        RankMonitorClient().init_workload_monitoring()
    assert str(err.value) == (
        f"protocol version mismatch: client speaks v{PROTOCOL_VERSION + 1}, monitor speaks "
        f"v{PROTOCOL_VERSION}; install the same resiliency-ft-core on both sides"
    )


def test_newer_hello_with_unknown_fields_still_gets_the_version_message(start_monitor):
    monitor = start_monitor()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
        raw.settimeout(5)
        raw.connect(str(monitor.socket_path))
        hello = {"t": "hello", "v": 99, "role": "rank", "pid": os.getpid(), "new_field": [1]}
        raw.send(json.dumps(hello).encode())
        reply = json.loads(raw.recv(70000))
    assert reply["code"] == "version"
    assert "client speaks v99, monitor speaks v1" in reply["msg"]
