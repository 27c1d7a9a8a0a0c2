"""A launcher whose agent cannot be built leaves no monitor and no socket directory behind."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launcher_harness import WORKER, alive, free_port

import resiliency.launcher._launch as launch_module
from resiliency.launcher import main
from resiliency.launcher._monitors import MonitorSet

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _children() -> set[int]:
    """Pids of this process's live children, from /proc parent links."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if parent == os.getpid() and alive(int(stat.parent.name)):
            pids.add(int(stat.parent.name))
    return pids


@pytest.fixture
def launcher_side_effects() -> Iterator[None]:
    """Undo what an in-process launcher changes in this process (handlers, env, log level)."""
    handlers = {sig: signal.getsignal(sig) for sig in _HANDLED}
    level = logging.getLogger("resiliency").level
    environ = dict(os.environ)
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    logging.getLogger("resiliency").setLevel(level)
    os.environ.clear()
    os.environ.update(environ)


@pytest.mark.usefixtures("launcher_side_effects")
def test_failed_agent_construction_leaves_nothing_behind(
    tmp_path: Path,
    marker_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tmp = tmp_path / "t"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where MonitorSet makes its directory
    before = _children()
    socket_dirs: list[Path] = []
    monitor_pids: set[int] = set()

    def failing_agent(*args: Any, **kwargs: Any) -> Any:
        monitors = next(a for a in (*args, *kwargs.values()) if isinstance(a, MonitorSet))
        socket_dirs.append(monitors.directory)
        # Monitors already running when construction fails are the worst case.
        monitors.start_all()
        monitor_pids.update(_children() - before)
        raise RuntimeError("the agent rejects its arguments")

    monkeypatch.setattr(launch_module, "FtElasticAgent", failing_agent)
    argv = [
        *("--nproc-per-node", "2"),
        *("--rdzv-backend", "static", "--master-port", str(free_port())),
        "--no-gpu-health-check",
        *(str(WORKER), "--marker-dir", str(marker_dir)),
    ]
    with caplog.at_level(logging.ERROR, logger="resiliency.launcher._launch"):
        code = main(argv)

    # Reported like any launcher error: exit code 1, the cause in the log.
    assert code == 1
    assert "launcher_error): RuntimeError: the agent rejects its arguments" in caplog.text

    assert [d.parent for d in socket_dirs] == [tmp]
    # The monitors' 0700 socket directory and the exit-info directory are gone (torch's own
    # torchelastic_* log directory stays, as it does under torchrun).
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("ft")) == []
    assert len(monitor_pids) == 2
    assert not [pid for pid in monitor_pids if alive(pid)]
    assert _children() <= before
    assert list(marker_dir.iterdir()) == []  # no worker ever started
