"""An injected crash ends the rank wherever the signal lands, even inside library code.

Seen in CI: the simulator's crash signal reached a rank while its emergency checkpoint polled the
store for a stop (every step), the poll took the ``SimulatedCrash`` for a flaky store, logged
"checking the store failed (will retry)" and the rank trained on; the fault matrix then saw a
crash that never recovered because it never happened. A real process with the real fault hook:
the signal is sent from inside a real store's ``check``, so it lands in the poll's ``try``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from resiliency.ft import FAULT_HOOK_ENV

_RANK = textwrap.dedent(
    """
    import os, signal, sys
    import torch.distributed as dist
    from resiliency.ft import FAULT_HOOK_SIGNALS, SimulatedCrash, install_fault_hook
    from resiliency.checkpoint._emergency.agreement import StopAgreement

    class CrashDuringCheck(dist.HashStore):
        def check(self, keys):
            if sys.argv[1] == "crash":
                os.kill(os.getpid(), signal.SIGRTMIN + FAULT_HOOK_SIGNALS["crash"])
                return super().check(keys)
            raise RuntimeError("Connection reset by peer")  # what a flaky store raises

    assert install_fault_hook()
    agreement = StopAgreement(CrashDuringCheck(), rank=0, world_size=2, prefix="t/")
    try:
        print("poll returned", agreement.poll(), flush=True)
    except SimulatedCrash as exc:
        print("the rank crashed:", exc, flush=True)
        sys.exit(3)
    """
)


def _rank(mode: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{FAULT_HOOK_ENV: "1"})
    return subprocess.run(
        [sys.executable, "-c", _RANK, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_crash_injected_during_the_emergency_stop_poll_is_not_taken_for_a_store_error():
    done = _rank("crash")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "the rank crashed: crash injected by resiliency-simulate" in done.stdout
    assert "checking the store failed" not in done.stderr


def test_a_flaky_store_still_reads_as_no_stop_yet():
    done = _rank("flaky")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "poll returned None" in done.stdout
    assert "checking the store failed (will retry): Connection reset by peer" in done.stderr
