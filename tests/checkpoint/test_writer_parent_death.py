"""A rank's writer dies with the rank, even while the writer is still importing torch.

The writer asks Linux for SIGKILL at its parent's death (PR_SET_PDEATHSIG) in an entry that
imports only the standard library, before it imports the package (torch: 4 s here, ~20 s on a
loaded node). A writer that asked only after its imports outlived a SIGKILLed rank by as long.

A stand-in ``torch`` on the writer's ``PYTHONPATH`` holds the writer inside its imports for as
long as the test needs (it writes a marker, then sleeps 300 s), so "the rank dies before the
writer's imports end" is a fact of the test, not a race it hopes to win.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from resiliency.checkpoint._writer.client import WRITER_ENTRY

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "writer_orphan_rank.py"
START_DEADLINE_S = 120.0  # the rank imports torch, the writer starts: slow on a loaded node
GONE_DEADLINE_S = 5.0  # a parent-death SIGKILL takes milliseconds; the import held 300 s

SLOW_TORCH = """\
import json
import os
import pathlib
import sys
import time

marker = pathlib.Path(os.environ["WRITER_TEST_IMPORT_MARKER"])
marker.with_suffix(".tmp").write_text(json.dumps({"pid": os.getpid(), "path": sys.path}))
marker.with_suffix(".tmp").replace(marker)
time.sleep(300)
"""


def _wait_for(path: Path, deadline_s: float, what: str) -> str:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} ({path}) within {deadline_s:.0f} s")
        time.sleep(0.02)
    return path.read_text()


def _state(pid: int) -> str | None:
    """The process state letter of ``pid`` (``Z``: dead, not reaped), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _wait_dead(pid: int, deadline_s: float) -> float | None:
    """Seconds until ``pid`` is dead (gone, or a zombie of its new parent); None at the deadline."""
    t0 = time.monotonic()
    while _state(pid) not in (None, "Z"):
        if time.monotonic() - t0 > deadline_s:
            return None
        time.sleep(0.01)
    return time.monotonic() - t0


@pytest.fixture
def slow_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``PYTHONPATH`` folder whose ``torch`` marks the writer's import and never finishes."""
    folder = tmp_path / "slow_imports"
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(SLOW_TORCH)
    monkeypatch.setenv("WRITER_TEST_IMPORT_MARKER", str(tmp_path / "writer_importing"))
    return folder


@pytest.fixture
def pids_to_clean() -> Iterator[list[int]]:
    """Pids a test started (directly or not); any still alive at teardown is SIGKILLed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _state(pid) not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)


def test_a_writer_still_importing_dies_with_its_sigkilled_rank(
    tmp_path: Path, slow_import_path: Path, pids_to_clean: list[int]
) -> None:
    argv = [sys.executable, str(RANK_SCRIPT), str(tmp_path), str(slow_import_path)]
    rank = subprocess.Popen(argv)
    pids_to_clean.append(rank.pid)
    try:
        started = json.loads(_wait_for(tmp_path / "rank.json", START_DEADLINE_S, "rank marker"))
        writer = int(started["writer"])
        pids_to_clean.append(writer)
        importing = json.loads(
            _wait_for(
                tmp_path / "writer_importing", START_DEADLINE_S, "marker of the writer's import"
            )
        )
        assert importing["pid"] == writer
        # Its entry ran by path; that folder's modules (client, protocol...) must not shadow
        # top-level modules in the writer.
        entry_dir = WRITER_ENTRY.parent.resolve()
        assert entry_dir not in [Path(p or ".").resolve() for p in importing["path"]]
        assert _parent(writer) == rank.pid
    finally:
        rank.kill()
        rank.wait(timeout=30)
    took = _wait_dead(writer, GONE_DEADLINE_S)
    assert took is not None, (
        f"writer pid {writer} (state {_state(writer)}) still alive {GONE_DEADLINE_S:.0f} s after "
        f"its rank (pid {rank.pid}) was SIGKILLed, while its import was held: it set no "
        "parent-death signal before importing"
    )


def test_a_writer_whose_rank_is_already_gone_exits_before_importing(
    tmp_path: Path, slow_import_path: Path
) -> None:
    # The rank's pid is not this writer's parent: as if the rank had died between the fork and
    # the parent-death request, leaving the writer to a new parent. It must exit, not import.
    env = {**os.environ, "PYTHONPATH": str(slow_import_path)}
    not_the_parent = os.getppid()
    proc = subprocess.run(
        [sys.executable, str(WRITER_ENTRY), "0", str(not_the_parent)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "writer_importing").exists(), "it went on to import the server"


@pytest.mark.parametrize("argv", [[], ["3"], ["three", "1"], ["3", "1", "2"]])
def test_a_malformed_writer_command_line_is_refused_with_its_usage(
    tmp_path: Path, slow_import_path: Path, argv: list[str]
) -> None:
    env = {**os.environ, "PYTHONPATH": str(slow_import_path)}
    proc = subprocess.run(
        [sys.executable, str(WRITER_ENTRY), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "FD PARENT_PID" in proc.stderr
    assert not (tmp_path / "writer_importing").exists()
