"""Each process and storage fault, injected for real into real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from resiliency.ft import FAULT_HOOK_ENV, FAULT_HOOK_SIGNALS
from resiliency.simulator import HOOK_ENV, HOOK_SIGNALS, InjectionError
from resiliency.simulator._proctree import descendants, read_proc, workers
from resiliency.simulator.injectors import (
    SlowDown,
    fill_disk,
    inject_into_rank,
    preempt_node,
    tear_newest_file,
)

FAKE_JOB = Path(__file__).with_name("_fake_job.py")


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _ticks(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _wait_until_still(path: Path, what: str, timeout: float = 30.0) -> int:
    """Wait until the counter in ``path`` (ticked every 20 ms) holds for 0.5 s; return it.

    A hook's hang takes hold when the rank next runs Python, which on a busy machine can be
    well after the signal: a fixed pause before sampling raced with it.
    """
    last = _ticks(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _ticks(path)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{what} still ticking {timeout} s after the hang was injected")


@pytest.fixture
def fake_job(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(nranks: int = 2, hook: bool = True) -> subprocess.Popen[bytes]:
        env = {**os.environ, HOOK_ENV: "1" if hook else "0"}
        proc = subprocess.Popen(
            [sys.executable, str(FAKE_JOB), str(tmp_path), str(nranks)],
            env=env,
            start_new_session=True,
        )
        started.append(proc)
        _wait(
            lambda: all((tmp_path / f"rank{r}.ready").exists() for r in range(nranks)),
            60,
            f"{nranks} fake workers to start",
        )
        return proc

    yield start
    for proc in started:
        tree = descendants(proc.pid)
        for p in [read_proc(proc.pid), *tree]:
            if p is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        # A killed rank's child is reparented out of the tree; it stays in the job's session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_the_hook_signal_table_agrees_with_ft_core() -> None:
    assert HOOK_SIGNALS == FAULT_HOOK_SIGNALS
    assert HOOK_ENV == FAULT_HOOK_ENV


def test_workers_are_found_by_pid_and_env_not_their_children(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(3)
    found = workers(launcher.pid)
    assert sorted(found) == [0, 1, 2]
    children = {int((tmp_path / f"rank{r}.child").read_text()) for r in range(3)}
    assert not children & {p.pid for p in found.values()}
    assert {int((tmp_path / f"rank{r}.ready").read_text()) for r in range(3)} == {
        p.pid for p in found.values()
    }


def test_kill_and_stop(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(2)
    found = workers(launcher.pid)
    inject_into_rank("stop", found[1])
    _wait(
        lambda: "T" in Path(f"/proc/{found[1].pid}/stat").read_text().split(")")[1][:3],
        10,
        "rank 1 to show state T (stopped)",
    )
    inject_into_rank("kill", found[0])
    _wait(
        lambda: (
            read_proc(found[0].pid) is None
            or Path(f"/proc/{found[0].pid}/stat").read_text().split(")")[1].split()[0] == "Z"
        ),
        10,
        "rank 0 to die",
    )
    os.kill(found[1].pid, signal.SIGCONT)


def test_hang_holding_the_gil_stops_every_thread(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(1)
    inject_into_rank("hang", workers(launcher.pid)[0])
    main = _wait_until_still(tmp_path / "rank0.main", "rank 0's main thread")
    thread = _ticks(tmp_path / "rank0.thread")
    time.sleep(1.0)  # the window in which neither thread may tick
    assert _ticks(tmp_path / "rank0.main") == main
    assert _ticks(tmp_path / "rank0.thread") == thread


def test_hang_releasing_the_gil_leaves_background_threads_running(fake_job, tmp_path) -> None:
    launcher = fake_job(1)
    inject_into_rank("hang_nogil", workers(launcher.pid)[0])
    main = _wait_until_still(tmp_path / "rank0.main", "rank 0's main thread")
    thread = _ticks(tmp_path / "rank0.thread")
    time.sleep(1.0)  # the window in which only the background thread ticks
    assert _ticks(tmp_path / "rank0.main") == main
    assert _ticks(tmp_path / "rank0.thread") > thread + 5


def test_crash_raises_inside_the_rank(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(1)
    rank0 = workers(launcher.pid)[0]
    inject_into_rank("crash", rank0)
    _wait(
        lambda: (
            read_proc(rank0.pid) is None
            or Path(f"/proc/{rank0.pid}/stat").read_text().split(")")[1].split()[0] == "Z"
        ),
        10,
        "the crashed rank to exit",
    )


def test_a_rank_without_the_hook_is_refused_not_killed(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(1, hook=False)
    rank0 = workers(launcher.pid)[0]
    with pytest.raises(InjectionError, match="no fault hook"):
        inject_into_rank("hang", rank0)
    before = _ticks(tmp_path / "rank0.main")
    # The rank goes on ticking (a read can catch the file mid-rewrite: 0, so poll).
    _wait(lambda: _ticks(tmp_path / "rank0.main") > before, 10, "the refused rank to keep ticking")


def test_slow_down_stops_and_always_resumes(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(1)
    rank0 = workers(launcher.pid)[0]
    states: set[str] = set()
    slow = SlowDown(rank0, ratio=0.5, duration_s=1.5, period_s=0.1)
    slow.start()
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        states.add(Path(f"/proc/{rank0.pid}/stat").read_text().split(")")[1].split()[0])
        time.sleep(0.005)
    slow.stop()
    assert "T" in states
    before = _ticks(tmp_path / "rank0.main")
    _wait(lambda: _ticks(tmp_path / "rank0.main") > before, 10, "the slowed worker to resume")
    with pytest.raises(InjectionError, match="ratio"):
        SlowDown(rank0, ratio=1.5)


def test_preempt_sends_sigterm_then_kills_the_tree(fake_job, tmp_path: Path) -> None:
    launcher = fake_job(2)
    tree = [read_proc(launcher.pid), *descendants(launcher.pid)]
    action = preempt_node(tree[0], grace_s=0.5)
    assert "SIGKILL" in action or "exited" in action
    launcher.wait(10)
    for proc in tree[1:]:
        _wait(
            lambda p=proc: (
                read_proc(p.pid) is None
                or Path(f"/proc/{p.pid}/stat").read_text().split(")")[1].split()[0] == "Z"
            ),
            10,
            f"pid {proc.pid} to be gone",
        )


def test_torn_checkpoint_truncates_or_flips_the_newest_file(tmp_path: Path) -> None:
    old, new = tmp_path / "step_1" / "a.distcp", tmp_path / "step_2" / "a.distcp"
    for path in (old, new):
        path.parent.mkdir()
        path.write_bytes(bytes(range(256)) * 4)
        time.sleep(0.01)
    actions = {tear_newest_file(tmp_path, seed) for seed in range(6)}
    assert old.read_bytes() == bytes(range(256)) * 4
    assert new.read_bytes() != bytes(range(256)) * 4
    assert any("truncated" in a for a in actions) and any("flipped" in a for a in actions)
    with pytest.raises(InjectionError, match="no committed checkpoint file"):
        tear_newest_file(tmp_path / "empty-does-not-exist", 0)


def test_disk_full_refuses_a_large_disk(tmp_path: Path) -> None:
    with pytest.raises(InjectionError, match="small dedicated"):
        fill_disk(tmp_path, hold_s=0.1)


def test_disk_full_fills_a_small_tmpfs_then_frees_it(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        fill_disk(mnt, hold_s=0.5)
        with pytest.raises(OSError, match="No space left"), (mnt / "ckpt").open("wb") as fh:
            fh.write(b"x" * 65536)
            fh.flush()
        _wait(lambda: not (mnt / ".sim-disk-full").exists(), 10, "the ballast to be removed")
        (mnt / "ckpt").write_bytes(b"x" * 65536)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_preempt_does_not_wait_for_a_launcher_that_exited_unreaped() -> None:
    # The runner reaps its launchers only on its own schedule: an exited launcher is a zombie
    # until then, and a zombie must count as gone, not make the preemption wait out its grace.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        proc = read_proc(child.pid)
        assert proc is not None
        t0 = time.monotonic()
        action = preempt_node(proc, grace_s=60.0)
        assert time.monotonic() - t0 < 20.0, action
        assert "all exited" in action
        assert read_proc(child.pid) is None  # exited, not yet reaped
    finally:
        child.kill()
        child.wait(10)
