"""Fixtures of the in-process restart tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess_harness import Run, Torchrun, read_records
from xdist_once import once


@pytest.fixture
def torchrun(tmp_path: Path) -> Iterator[Torchrun]:
    """Start torchrun jobs; every one still running at teardown is killed by pid."""
    runner = Torchrun(tmp_path)
    yield runner
    runner.kill()


def _run_unbroken(folder: Path) -> None:
    runner = Torchrun(folder)
    try:
        run = runner.run()
    finally:
        runner.kill()
    assert run.returncode == 0, run.output[-6000:]


@pytest.fixture(scope="session")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same job with no fault: the reference every restarted run must match.

    One torchrun of 4 ranks for the whole pytest run, however many xdist workers ask for it.
    """
    folder = once(tmp_path_factory, "inprocess-unbroken", _run_unbroken)
    return Run(0, (folder / "run.log").read_text(errors="replace"), read_records(folder / "run"))
