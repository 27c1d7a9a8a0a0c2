"""Run an expensive reference job once per pytest run, even when pytest-xdist runs 4 workers.

A session-scoped fixture runs once per *worker* under xdist: a 4-rank reference torchrun that
every in-process restart test compares with would run 4 times, on 2 cores. ``once`` makes the
first worker that asks run it into a folder shared by the run's workers (the parent of each
worker's base temp folder) while holding an exclusive lock; the others wait on the lock and read
the finished folder. A run that failed leaves no ``done`` file, so the next worker runs it again
(in a folder of its own) and reports its own failure. Without xdist it runs in a fresh temp
folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

DONE = "done"


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no turn at {path} within {timeout} s: another pytest-xdist worker "
                        "still runs the shared reference job"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    produce: Callable[[Path], None],
    timeout: float = 900,
) -> Path:
    """The folder in which ``produce(folder)`` ran to the end, once for all workers of this run.

    Args:
        tmp_path_factory: pytest's factory (its base folder tells the run's shared folder).
        name: the job's folder name, unique among the suite's shared jobs.
        produce: writes the job's results into the folder it is given; raises if the job failed.
        timeout: how long a worker waits for another worker's run of the same job.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        folder = tmp_path_factory.mktemp(name)
        produce(folder)
        return folder
    shared = tmp_path_factory.getbasetemp().parent / f"once-{name}"
    shared.mkdir(exist_ok=True)
    done = shared / DONE
    with _locked(shared / "lock", timeout):
        if not done.exists():
            folder = shared / f"job-{os.environ['PYTEST_XDIST_WORKER']}"
            folder.mkdir()
            produce(folder)
            done.write_text(folder.name)  # names the folder that holds the finished job
        return shared / done.read_text()
