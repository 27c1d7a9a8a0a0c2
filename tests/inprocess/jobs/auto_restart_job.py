"""A script under inprocess.auto_restart.monitor_and_restart: its first child is SIGKILLed, the
second exits 1, the third exits 0. Usage: auto_restart_job.py COUNTER_FILE."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from resiliency.inprocess.auto_restart import monitor_and_restart

monitor_and_restart(restart_delay=0.05)
counter = Path(sys.argv[1])
run = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(run))
print(f"child run {run} (pid {os.getpid()})", flush=True)
if run == 1:
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(1 if run == 2 else 0)
