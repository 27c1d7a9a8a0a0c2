"""Fixtures of the in-process restart tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess_harness import Run, Torchrun


@pytest.fixture
def torchrun(tmp_path: Path) -> Iterator[Torchrun]:
    """Start torchrun jobs; every one still running at teardown is killed by pid."""
    runner = Torchrun(tmp_path)
    yield runner
    runner.kill()


@pytest.fixture(scope="session")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The same job with no fault: the reference every restarted run must match."""
    runner = Torchrun(tmp_path_factory.mktemp("unbroken"))
    try:
        run = runner.run()
        assert run.returncode == 0, run.output[-6000:]
        yield run
    finally:
        runner.kill()
