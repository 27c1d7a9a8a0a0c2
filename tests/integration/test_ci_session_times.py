"""`.ci/session_times.py`: nox's output passes through unchanged, then each session's time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "session_times.py"


def test_every_session_is_timed_slowest_first_and_a_cut_off_one_is_named() -> None:
    # Each line is fed when the previous session's time has passed, as nox writes them.
    feeder = (
        "import sys, time\n"
        "for line, pause in [('nox > Running session fast', 0.0), ('pytest output', 0.0),\n"
        "                    ('nox > Session fast was successful in 1 second.', 0.0),\n"
        "                    ('nox > Running session slow-3.11', 0.0),\n"
        "                    ('FAILED tests/a.py::test_b - AssertionError: ' + 'x' * 900, 0),\n"
        "                    ('ERROR tests/a.py::test_c - RuntimeError: no fixture', 0.0),\n"
        "                    ('nox > Session slow-3.11 failed.', 0.6),\n"
        "                    ('nox > Running session cut', 0.0)]:\n"
        "    time.sleep(pause); print(line, flush=True)\n"
    )
    nox = subprocess.Popen([sys.executable, "-c", feeder], stdout=subprocess.PIPE)
    out = subprocess.run(
        [sys.executable, str(SCRIPT)],
        stdin=nox.stdout,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert nox.stdout is not None
    nox.stdout.close()
    assert nox.wait(30) == 0
    passed, rest = out.split("\nsession times, slowest first:\n")
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
    assert "session times, slowest first:" in out
    assert "failed tests" not in out
