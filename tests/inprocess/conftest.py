"""Fixtures of the in-process restart tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from inprocess_harness import PREIMPORTED_FLAGS, FtLauncher, Run, Torchrun, read_records
from xdist_once import once


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> dist.HashStore:
    """torchrun's variables for a job of one rank; an in-memory store for its Wrapper."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    return dist.HashStore()


@pytest.fixture
def torchrun(tmp_path: Path) -> Iterator[Torchrun]:
    """Start torchrun jobs; every one still running at teardown is killed by pid."""
    runner = Torchrun(tmp_path)
    yield runner
    runner.kill()


@pytest.fixture
def ft_launcher(tmp_path: Path) -> Iterator[FtLauncher]:
    """Start jobs under ft-launcher, every rank forked from its pre-imported server (the cheap
    way to run tests whose subject is the Wrapper, not the launcher); killed by pid at teardown."""
    runner = FtLauncher(tmp_path, flags=PREIMPORTED_FLAGS)
    yield runner
    runner.kill()


def _run_unbroken(folder: Path) -> None:
    runner = FtLauncher(folder, flags=PREIMPORTED_FLAGS)
    try:
        run = runner.run()
    finally:
        runner.kill()
    assert run.returncode == 0, run.output[-6000:]


@pytest.fixture(scope="session")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same job with no fault: the reference every restarted run must match.

    One job of 4 ranks for the whole pytest run, however many xdist workers ask for it (under
    ft-launcher's pre-imported server: which launcher started the ranks does not change what
    they train).
    """
    folder = once(tmp_path_factory, "inprocess-unbroken", _run_unbroken)
    return Run(0, (folder / "run.log").read_text(errors="replace"), read_records(folder / "run"))
