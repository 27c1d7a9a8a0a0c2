"""Fixtures for tests that run real ft-launcher processes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from launcher_harness import Launcher, kill_leftovers
from round_store import RoundStores


@pytest.fixture
def marker_dir(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


@pytest.fixture
def launch(tmp_path: Path, marker_dir: Path) -> Iterator[Callable[..., Launcher]]:
    """Start ft-launcher subprocesses; every launcher, monitor and worker is killed at teardown."""
    started: list[Launcher] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Launcher:
        launcher = Launcher(args, tmp_path / f"launcher-{len(started)}.log", env=env)
        started.append(launcher)
        return launcher

    yield start
    for launcher in started:
        launcher.kill()
    kill_leftovers(marker_dir)


@pytest.fixture
def round_stores() -> Iterator[RoundStores]:
    """A real round store for the launcher's shared-state code; closed at teardown."""
    stores = RoundStores()
    yield stores
    stores.close()
