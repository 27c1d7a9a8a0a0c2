"""--ft-preimport: workers forked from a fork server that imported torch once, across restarts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, WORKER, markers, wait_for_markers

from resiliency.launcher.fork_server import ForkedProc, ForkServer

pytestmark = pytest.mark.slow

RECORD_WORKER = Path(__file__).parent / "workers" / "record_worker.py"


def _server_pid(log: str) -> int:
    found = re.findall(r"fork server pid (\d+) ready", log)
    assert len(found) == 1, log
    return int(found[0])


def _parents(marker_dir: Path) -> dict[tuple[int, int], int]:
    """(rank, attempt) -> the pid of the worker's parent."""
    out = {}
    for name in markers(marker_dir, "parent"):
        _, rank, attempt, ppid = name.split("-")
        out[(int(rank), int(attempt))] = int(ppid)
    return out


@pytest.mark.parametrize("mode,expected", [("crash", "exited with code 7"), ("hang_hb", "hung")])
def test_restarted_workers_are_forked_from_the_preimported_server(
    launch, marker_dir: Path, mode: str, expected: str
) -> None:
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            *FAST_FT_FLAGS,
            "--ft-preimport",
            "torch",
            str(WORKER),
            "--mode",
            mode,
            "--marker-dir",
            str(marker_dir),
        ]
    )
    assert launcher.wait(60) == 0, launcher.log()
    log = launcher.log()
    assert expected in log and "restarting the worker group" in log
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
    server = _server_pid(log)
    # Both attempts of both ranks came from the one server, none from the launcher.
    assert _parents(marker_dir) == {(r, a): server for r in (0, 1) for a in (0, 1)}
    assert not os.path.exists(f"/proc/{server}"), "the fork server outlived the launcher"


def test_a_forked_workers_exception_gives_torchruns_report_and_error_file(
    launch, tmp_path: Path
) -> None:
    error_file = tmp_path / "launcher-error.json"
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            *FAST_FT_FLAGS,
            "--ft-preimport",
            "torch",
            str(RECORD_WORKER),
        ],
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    assert launcher.wait(60) == 1, launcher.log()
    log = launcher.log()
    assert "Root Cause (first observed failure)" in log
    assert "RuntimeError: injected failure in rank 1" in log
    assert error_file.exists()


def test_a_command_the_server_cannot_fork_starts_as_a_new_process(tmp_path: Path) -> None:
    server = ForkServer(["json"])
    try:
        out = tmp_path / "out.txt"
        forked = server.spawn(
            [sys.executable, "-c", "print('x')"], dict(os.environ), str(out), None
        )  # '-c' is not a script: refused, started the usual way
        assert isinstance(forked, subprocess.Popen)
        assert forked.wait(30) == 0 and out.read_text() == "x\n"
        script = tmp_path / "exit3.py"
        script.write_text("import sys, os\nprint(os.environ['ONLY_HERE'])\nsys.exit(3)\n")
        proc = server.spawn(
            [sys.executable, "-u", str(script)], {"ONLY_HERE": "yes"}, str(out), None
        )
        assert isinstance(proc, ForkedProc)
        assert proc.wait(30) == 3 and out.read_text() == "yes\n"
    finally:
        started = time.monotonic()
        server.close()
    # It ends on its own when the launcher's end closes, not by the kill after 10 s.
    assert server._proc.poll() == 0
    assert time.monotonic() - started < 8


def test_a_worker_gets_sigchld_back_and_its_exit_is_reported_without_a_poll(
    tmp_path: Path,
) -> None:
    server = ForkServer(["json"])
    try:
        out = tmp_path / "out.txt"
        script = tmp_path / "dispositions.py"
        # The server's SIGCHLD handler and wakeup pipe are its own: a worker has a new
        # interpreter's (set_wakeup_fd returns the previous descriptor: -1 for none).
        script.write_text(
            "import signal, sys\n"
            "print(signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL, signal.set_wakeup_fd(-1))\n"
            "sys.stdout.flush()\n"
            "import os\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        proc = server.spawn([sys.executable, str(script)], dict(os.environ), str(out), None)
        assert isinstance(proc, ForkedProc)
        # Reported through the server's SIGCHLD wakeup (its 50 ms poll is only a fallback).
        assert proc.wait(30) == -signal.SIGKILL
        assert out.read_text() == "True -1\n"
    finally:
        server.close()


def test_a_module_the_server_cannot_import_stops_the_launcher_before_any_worker(
    launch, marker_dir: Path
) -> None:
    launcher = launch(
        [
            "--nproc-per-node",
            "1",
            *FAST_FT_FLAGS,
            "--ft-preimport",
            "no_such_module_xyz",
            str(WORKER),
            "--marker-dir",
            str(marker_dir),
        ]
    )
    assert launcher.wait(60) == 1, launcher.log()
    log = launcher.log()
    assert "no_such_module_xyz" in log and "fork server exited" in log
    assert list(marker_dir.iterdir()) == []


def test_a_sigterm_to_the_launchers_process_group_ends_the_job_promptly(
    launch, marker_dir: Path
) -> None:
    # A scheduler signals the whole group, fork server included: the server must outlive it to
    # report the workers' exits, or the launcher waits out --term-timeout for them.
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            *FAST_FT_FLAGS,
            "--term-timeout",
            "30",
            "--ft-preimport",
            "json",
            str(WORKER),
            "--mode",
            "exit_on_sigterm",
            "--marker-dir",
            str(marker_dir),
        ]
    )
    wait_for_markers(marker_dir, "armed", 2, 60)
    started = time.monotonic()
    os.killpg(launcher.proc.pid, signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.log()
    assert time.monotonic() - started < 15, launcher.log()
    assert markers(marker_dir, "sigterm") == ["sigterm-0-0", "sigterm-1-0"]


def test_the_entry_point_starts_the_server_before_importing_torch() -> None:
    # The launcher's own imports (torch, pydantic) run while the server imports its modules.
    probe = (
        "import sys, resiliency.launcher.cli, resiliency.launcher as L\n"
        "assert 'torch' not in sys.modules and 'pydantic' not in sys.modules\n"
        "assert L.FtElasticAgent and 'torch' in sys.modules  # resolved on first use\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--nnodes", "1", "--ft-preimport", "torch,lightning", "t.py"], ["torch", "lightning"]),
        (["--ft-preimport=torch", "t.py"], ["torch"]),
        (["--nnodes", "1", "t.py", "--ft-preimport", "torch"], []),  # the script's argument
        (["-m", "pkg", "--ft-preimport", "torch"], []),
        (["--help", "--ft-preimport", "torch"], []),
        (["--ft-preimport", "not a module", "t.py"], []),
        (["--ft-pre", "torch", "t.py"], []),  # an abbreviation: left to the parser
    ],
)
def test_the_early_start_reads_only_the_launchers_own_flag(
    argv: list[str], expected: list[str]
) -> None:
    from resiliency.launcher.cli import _early_modules  # noqa: PLC0415

    assert _early_modules(argv) == expected


def test_a_refused_command_line_leaves_no_fork_server_behind(launch) -> None:
    # The server starts before the parser runs; the suite's leak check (tests/conftest.py)
    # fails this test if it, or any process of the launcher, is still alive afterwards.
    launcher = launch(["--ft-preimport", "json", "--no-such-flag", str(WORKER)])
    assert launcher.wait(60) == 2, launcher.log()
    assert "--no-such-flag" in launcher.log()
