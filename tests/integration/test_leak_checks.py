"""The root conftest's leak checks, run on a throw-away test suite in a child pytest.

Each leaky test must fail at teardown naming what it left behind; the well-behaved ones (cleanup
by monkeypatch, a module fixture that stops its thread, a session fixture pulled in lazily) must
pass. The child gets a short grace period so the deliberate leaks cost little time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = Path(__file__).parents[1] / "conftest.py"
XDIST_GROUPING = CONFTEST.parent / "xdist_grouping.py"  # a plugin the conftest loads
# The test zygote (never a leak itself; its jobs are checked like any process of the test).
ZYGOTE_FILES = [
    CONFTEST.parent / name for name in ("zygote.py", "zygote_client.py", "forked_script.py")
]

SUITE = """
import os, signal, socket, subprocess, threading, time
import pytest
from zygote_client import start_python

_keep = []


def test_clean():
    pass


def test_leaks_process():
    _keep.append(subprocess.Popen(["sleep", "30"]))


def test_leaks_orphan():
    # The shell exits at once; its background child is reparented away from pytest.
    subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 &"], check=True)


def test_leaks_zombie():
    _keep.append(subprocess.Popen(["true"]))


def test_leaks_thread():
    stop = threading.Event()
    _keep.append(stop)
    threading.Thread(target=stop.wait, args=(20,), name="leaky-thread", daemon=True).start()


def test_leaks_env():
    os.environ["LEAKY_VAR"] = "1"


def test_leaks_signal():
    signal.signal(signal.SIGUSR1, lambda *_: None)


def test_leaks_socket():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    _keep.append(sock)


def test_a_forked_job_that_ended_is_fine(tmp_path):
    # Starts this process's zygote (tests/zygote.py), which outlives the test on purpose.
    (tmp_path / "quick.py").write_text("pass")
    assert start_python((), [str(tmp_path / "quick.py")], dict(os.environ)).wait(60) == 0


def test_leaks_forked_job(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time; time.sleep(30)")
    _keep.append(start_python((), [str(tmp_path / "sleeper.py")], dict(os.environ)))


def test_exiting_thread_is_fine():
    threading.Thread(target=time.sleep, args=(0.2,)).start()


def test_monkeypatch_is_fine(monkeypatch):
    monkeypatch.setenv("HOME", "/nowhere")
    monkeypatch.setenv("NEW_VAR", "x")


@pytest.mark.allow_leak("thread", reason="the marker lets this one through")
def test_allowed():
    stop = threading.Event()
    _keep.append(stop)
    threading.Thread(target=stop.wait, args=(2,), daemon=True).start()


@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "60"])
    os.environ["SERVER_VAR"] = "1"
    yield proc
    proc.kill()
    proc.wait()
    del os.environ["SERVER_VAR"]


def test_lazy_session_fixture_is_fine(request):
    assert request.getfixturevalue("server").poll() is None


@pytest.fixture(scope="module")
def forgotten_thread():
    stop = threading.Event()
    _keep.append(stop)
    threading.Thread(target=stop.wait, args=(20,), name="module-thread", daemon=True).start()
    yield


def test_module_fixture_a(forgotten_thread, server):
    assert os.environ["SERVER_VAR"] == "1"


def test_module_fixture_last(forgotten_thread):
    pass
"""

LEAKY = {
    "test_leaks_process": "process pid \\d+: sleep 30",
    "test_leaks_orphan": "process pid \\d+: sleep 30",
    "test_leaks_zombie": "process pid \\d+ \\(zombie: exited, never reaped\\)",
    "test_leaks_thread": "thread 'leaky-thread' \\(daemon\\)",
    "test_leaks_env": "environment variable LEAKY_VAR: None before, '1' after",
    "test_leaks_signal": "signal handler for SIGUSR1",
    "test_leaks_socket": "socket fd \\d+ \\(tcp local",
    # A forked job shows the zygote's command line (a fork keeps it).
    "test_leaks_forked_job": "process pid \\d+: \\S*python\\S* \\S*/zygote\\.py ",
    "test_module_fixture_last": (
        "thread 'module-thread' \\(daemon\\) left by fixture 'forgotten_thread' \\(module scope\\)"
    ),
}


def test_the_leak_checks_fail_leaky_tests_and_pass_clean_ones(tmp_path: Path) -> None:
    # The repository's layout: the conftest one level below the rootdir, where pytest would not
    # call conftest hooks for the session-scoped fixtures that hang off the Session node.
    (tmp_path / "tests").mkdir()
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    for path in (XDIST_GROUPING, *ZYGOTE_FILES):
        shutil.copy(path, tmp_path / "tests")
    (tmp_path / "tests" / "test_suite.py").write_text(textwrap.dedent(SUITE))
    env = {**os.environ, "RESILIENCY_LEAK_GRACE_S": "0.5"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "--rootdir",
            ".",
            "tests",
        ],
        cwd=tmp_path,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    errors = set(re.findall(r"^ERROR tests/test_suite\.py::(\w+)", out, re.MULTILINE))
    passed = set(re.findall(r"^PASSED tests/test_suite\.py::(\w+)", out, re.MULTILINE))
    assert errors == set(LEAKY), out
    for test, pattern in LEAKY.items():
        assert re.search(f"tests/test_suite.py::{test} leaked:\\n(  .*\\n)*  {pattern}", out), (
            test,
            out,
        )
    assert "test_lazy_session_fixture_is_fine" in passed, out
    assert "test_monkeypatch_is_fine" in passed, out
    assert "test_allowed" in passed, out
    assert "test_a_forked_job_that_ended_is_fine" in passed, out


def test_a_marker_without_a_reason_stops_the_run(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    shutil.copy(XDIST_GROUPING, tmp_path)
    (tmp_path / "test_marker.py").write_text(
        'import pytest\n\n@pytest.mark.allow_leak("thread")\ndef test_x():\n    pass\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", "."],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "reason='why'" in result.stdout + result.stderr
