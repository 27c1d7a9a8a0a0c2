"""The simulator's injected hangs outlast signals (issue 28's scored run found they did not).

libc's ``sleep()`` returns early when a signal handler runs. The rank monitor's stack-dump
request (faulthandler on a signal) therefore ended an injected ``hang_nogil`` at once: the rank
trained on, and the stacks of its peers, dumped a moment later, showed healthy ranks. A real
process: the hook installed, a counter it advances every 10 ms; after the hang and three dump
requests, the counter must stand still.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resiliency.ft.fault_hook import FAULT_HOOK_ENV, FAULT_HOOK_SIGNALS

_RANK = """
import faulthandler, signal, sys, time
from pathlib import Path
from resiliency.ft.fault_hook import install_fault_hook
assert install_fault_hook()
faulthandler.register(signal.SIGUSR2, all_threads=True)
counter = Path(sys.argv[1])
scratch = counter.with_suffix(".tmp")
n = 0
while True:
    n += 1
    # Replaced whole: the hang's signal may land between write_text's truncation and its write,
    # which left the counter empty for good (seen once in CI).
    scratch.write_text(str(n))
    scratch.replace(counter)
    time.sleep(0.01)
"""


def _count(path: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.01)
    raise AssertionError(f"the rank never wrote {path}")


@pytest.mark.parametrize("kind", ["hang", "hang_nogil"])
def test_a_stack_dump_request_does_not_end_an_injected_hang(tmp_path: Path, kind: str) -> None:
    counter = tmp_path / "counter"
    env = {**os.environ, FAULT_HOOK_ENV: "1"}
    with subprocess.Popen(
        [sys.executable, "-c", _RANK, str(counter)], env=env, stderr=subprocess.DEVNULL
    ) as rank:
        try:
            first = _count(counter)
            deadline = time.monotonic() + 30
            while _count(counter) == first and time.monotonic() < deadline:
                time.sleep(0.01)  # running
            os.kill(rank.pid, signal.SIGRTMIN + FAULT_HOOK_SIGNALS[kind])
            time.sleep(0.3)  # the hook is in its sleep
            hung_at = _count(counter)
            for _ in range(3):
                os.kill(rank.pid, signal.SIGUSR2)  # the monitor's stack-dump request
                time.sleep(0.2)
            time.sleep(0.5)
            assert _count(counter) == hung_at, f"{kind}: the rank ran on after a dump request"
            assert rank.poll() is None
        finally:
            rank.kill()
