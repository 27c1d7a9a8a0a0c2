"""`.ci/session_times.py`: nox's output passes through unchanged, then each session's time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "session_times.py"
HEADER = "session times, slowest first (wall; CPU where the suite measured it):"


def _feed(lines: list[str], pause_before: dict[str, float]) -> str:
    """Feed nox's lines to the script; before a line of ``pause_before``, wait until the script
    has passed the previous line through (so it has read it), then pause. The pause is then
    measured from when the script saw the previous line, whatever its start-up took."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdin is not None and proc.stdout is not None
    out: list[str] = []
    try:
        for previous, line in zip([None, *lines], lines, strict=False):
            if line in pause_before and previous is not None:
                while (echoed := proc.stdout.readline()) != "":  # pytest-timeout bounds it
                    out.append(echoed)
                    if echoed.rstrip("\n") == previous:
                        break
                time.sleep(pause_before[line])
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        rest, _ = proc.communicate(timeout=60)  # closes stdin: the script ends its report
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
    return "".join(out) + rest


def test_every_session_is_timed_slowest_first_and_a_cut_off_one_is_named() -> None:
    lines = [
        "nox > Running session fast",
        "pytest output",
        "nox > Session fast was successful in 1 second.",
        "nox > Running session slow-3.11",
        "FAILED tests/a.py::test_b - AssertionError: " + "x" * 900,
        "ERROR tests/a.py::test_c - RuntimeError: no fixture",
        "nox > Session slow-3.11 failed.",
        "nox > Running session cut",
    ]
    out = _feed(lines, pause_before={"nox > Session slow-3.11 failed.": 0.6})
    passed, rest = out.split(f"\n{HEADER}\n")
    table, failed = rest.split("\nfailed tests, by session:\n")
    assert passed.splitlines()[1] == "pytest output"  # nox's output, unchanged
    rows = [line.split() for line in table.splitlines()]
    assert rows[0][2] == "slow-3.11", table  # the slowest first (the others took ~0 s)
    verdicts = {r[2]: " ".join(r[3:]) for r in rows[:-1]}
    assert verdicts == {
        "slow-3.11": "failed",
        "fast": "was successful",
        "cut": "ended without a verdict",
    }
    assert float(rows[0][0]) >= 0.5  # the failed session took its 0.6 s
    assert rows[-1][2:] == ["in", "all"]
    # the failed tests again, under their session, each line cut to a readable length
    assert failed.splitlines()[0] == "  slow-3.11:", failed
    assert failed.splitlines()[1].startswith("    FAILED tests/a.py::test_b - AssertionError: x")
    assert len(failed.splitlines()[1]) == 4 + 400
    assert failed.splitlines()[2:] == ["    ERROR tests/a.py::test_c - RuntimeError: no fixture"]


def test_a_green_run_lists_no_failed_tests() -> None:
    lines = "nox > Running session ok\n1 passed\nnox > Session ok was successful in 1 second.\n"
    out = subprocess.run(
        [sys.executable, str(SCRIPT)],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert HEADER in out
    assert "failed tests" not in out


def test_the_suites_sessions_take_its_times_and_cpu_and_the_suite_is_listed_apart() -> None:
    # what tools/nox_lanes.py prints, inside nox's own lines for the `suite` session
    lines = [
        "nox > Running session suite",
        "nox > Running session ptl",
        "nox > Session ptl was successful in 5 minutes.",
        "suite > ptl passed in 280.8 s (lane 1, 412.5 s of CPU)",
        "nox > Running session ft_core-3.10",
        "FAILED tests/ft_core/test_x.py::test_y - AssertionError",
        "nox > Session ft_core-3.10 failed.",
        "suite > ft_core-3.10 failed (exit status 1) in 20.0 s (lane 0, 31.0 s of CPU)",
        "nox > Session suite failed.",
    ]
    out = subprocess.run(
        [sys.executable, str(SCRIPT)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    table = out.split(f"\n{HEADER}\n")[1].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["280.8", "s", "412.5", "s", "ptl", "passed"], table
    assert rows[1] == ["20.0", "s", "31.0", "s", "ft_core-3.10", "failed", "(exit", "status", "1)"]
    assert rows[2] == ["300.8", "s", "443.5", "s", "in", "all"]
    assert rows[3][2:5] == ["suite", "failed", "(wall"], table  # apart, not counted in all
    assert "  ft_core-3.10:\n    FAILED tests/ft_core/test_x.py::test_y" in out
