"""tools/nox_lanes.py: the sessions `nox` runs, two lanes at once, with real child processes.

Each "session" here is a small Python child that proves what it claims through marker files:
two sessions that wait for each other's marker can only both pass when they run at once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "nox_lanes.py"
DEADLINE_S = 60.0  # what a child waits for another's marker before it gives up (and fails)


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nox_lanes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["nox_lanes"] = module  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(module)
    return module


lanes = _load()

# A child: write its own marker, wait (bounded) for the markers it needs, print, exit CODE.
CHILD = """
import sys, time
from pathlib import Path
d, me, code = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(d / f"{me}.started").touch()
deadline = time.monotonic() + float(sys.argv[4])
for other in sys.argv[5:]:
    while not (d / f"{other}.started").exists():
        if time.monotonic() > deadline:
            print(f"{me}: gave up waiting for {other}")
            sys.exit(1)
        time.sleep(0.01)
for i in range(3):
    print(f"{me} line {i}")
sys.exit(code)
"""


def _command(
    tmp: Path, waits: dict[str, list[str]], codes: dict[str, int] | None = None
) -> Callable[[str], list[str]]:
    codes = codes or {}

    def command(name: str) -> list[str]:
        return [
            sys.executable, "-c", CHILD, str(tmp), name, str(codes.get(name, 0)),
            str(DEADLINE_S), *waits.get(name, []),
        ]  # fmt: skip

    return command


def test_the_two_lanes_run_at_once(tmp_path: Path) -> None:
    # a and b each wait for the other's marker: both pass only when they overlap.
    command = _command(tmp_path, {"a": ["b"], "b": ["a"]})
    results = lanes.run_lanes([["a"], ["b"]], command, timeout=120, log_dir=tmp_path / "logs")
    assert sorted((r.name, r.verdict) for r in results) == [("a", "passed"), ("b", "passed")]


def test_a_lane_that_is_done_takes_the_other_lanes_next_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a (lane 0) runs until c has started; c is lane 0's next one, so only lane 1, done with b,
    # can start it while a still runs.
    command = _command(tmp_path, {"a": ["c"]})
    results = lanes.run_lanes([["a", "c"], ["b"]], command, timeout=120, log_dir=tmp_path / "l")
    assert sorted(r.name for r in results if r.verdict == "passed") == ["a", "b", "c"]
    assert "suite > lane 1: c started" in capsys.readouterr().out


def test_each_output_is_printed_whole_and_a_failure_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = _command(tmp_path, {"a": ["b"], "b": ["a"]}, codes={"a": 3})
    results = lanes.run_lanes([["a"], ["b"]], command, timeout=120, log_dir=tmp_path / "logs")
    out = capsys.readouterr().out
    verdicts = {r.name: r.verdict for r in results}
    assert verdicts == {"a": "failed (exit status 3)", "b": "passed"}
    for name in ("a", "b"):  # the three lines of one session come together, framed
        block = out.split(f"====== {name}: its whole output")[1].split(f"====== end of {name}")[0]
        assert [line for line in block.splitlines() if " line " in line] == [
            f"{name} line {i}" for i in range(3)
        ]
    table = lanes.summary(results, wall=1.0, log_dir=tmp_path / "logs")
    assert "1 passed, 1 failed" in table
    assert f"suite > FAILED a: failed (exit status 3); its log: {tmp_path / 'logs' / 'a.log'}" in (
        table
    )


# A session whose own child burns CPU_S of CPU time, then is waited for: its time is the
# session's too, as pytest's workers' and their jobs' are.
BURN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass"
)
BURNER = f"""
import subprocess, sys
subprocess.run([sys.executable, "-c", {BURN!r}, sys.argv[1]], check=True)
"""
CPU_S = 0.5


def test_a_sessions_cpu_time_counts_its_descendants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def command(name: str) -> list[str]:
        return [sys.executable, "-c", BURNER, str(CPU_S)]

    results = lanes.run_lanes([["burn"], []], command, timeout=120, log_dir=tmp_path / "logs")
    assert results[0].verdict == "passed"
    # the grandchild's CPU_S and two interpreters' start-up; a poll would have counted 0
    assert CPU_S <= results[0].cpu_seconds < CPU_S + 10, results
    assert f"(lane 0, {results[0].cpu_seconds:.1f} s of CPU)" in capsys.readouterr().out
    table = lanes.summary(results, wall=1.0, log_dir=tmp_path / "logs")
    assert "s of CPU, two lanes at once): 1 passed, 0 failed" in table
    assert table.splitlines()[1].split()[2:5] == [f"{results[0].cpu_seconds:.1f}", "s", "burn"]


# A session that starts a grandchild in its process group, writes both pids, then hangs.
HANGING = """
import os, subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
Path(sys.argv[1]).write_text(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0): look at its state.
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "Z"


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Pids a test may leave behind when it fails: killed by pid at its end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_session_past_its_timeout_is_stopped_with_its_whole_process_group(
    tmp_path: Path, reaper: list[int]
) -> None:
    pids = tmp_path / "pids"

    def command(name: str) -> list[str]:
        return [sys.executable, "-c", HANGING, str(pids)]

    # 5 s is ample for two interpreters to start on a loaded machine; the pids are checked.
    results = lanes.run_lanes([["hang"], []], command, timeout=5, log_dir=tmp_path / "logs")
    assert results[0].verdict == "timed out after 5 s and was stopped"
    session, grandchild = map(int, pids.read_text().split())
    reaper += [session, grandchild]
    assert _gone(session) and _gone(grandchild)


DRIVER = """
import signal, sys, importlib.util
from pathlib import Path
spec = importlib.util.spec_from_file_location("nox_lanes", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules["nox_lanes"] = m; spec.loader.exec_module(m)
signal.signal(signal.SIGTERM, signal.default_int_handler)
hanging, pids = sys.argv[2], sys.argv[3]
try:
    m.run_lanes([["hang"]], lambda n: [sys.executable, "-c", hanging, pids], 600, Path(sys.argv[4]))
except KeyboardInterrupt:
    print("stopped")
"""


def test_sigterm_to_the_runner_stops_the_running_sessions(
    tmp_path: Path, reaper: list[int]
) -> None:
    pids = tmp_path / "pids"
    argv = [sys.executable, "-c", DRIVER, str(SCRIPT), HANGING, str(pids), str(tmp_path / "l")]
    runner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    reaper.append(runner.pid)
    deadline = time.monotonic() + DEADLINE_S
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the session never wrote its pids"
        time.sleep(0.05)
    session, grandchild = map(int, pids.read_text().split())
    reaper += [session, grandchild]
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=DEADLINE_S)
    assert "stopped" in out
    assert _gone(session) and _gone(grandchild)


def test_names_expand_to_nox_sessions_and_a_wrong_one_is_refused() -> None:
    listed = [
        {"session": "ft_core-3.10", "name": "ft_core"},
        {"session": "ft_core-3.11", "name": "ft_core"},
        {"session": "lint", "name": "lint"},
    ]
    assert lanes.expand([["ft_core"], ["lint"]], listed) == [
        ["ft_core-3.10", "ft_core-3.11"],
        ["lint"],
    ]
    assert lanes.expand([["ft_core-3.11"]], listed) == [["ft_core-3.11"]]
    with pytest.raises(lanes.LanesError, match="no nox session named 'lnit'"):
        lanes.expand([["lnit"]], listed)
    with pytest.raises(lanes.LanesError, match=r"'ft_core-3\.10' is in the lanes twice"):
        lanes.expand([["ft_core"], ["ft_core-3.10"]], listed)
