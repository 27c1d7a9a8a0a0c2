"""One rank that calls inprocess.tools.inject_fault, then waits for its fault.

Usage: inject_fault_job.py FAULT[,FAULT...] KEEP_ALIVE SEED TICKS_FILE WAIT_S (RANK and
WORLD_SIZE from the environment). Prints "armed" once inject_fault returned; a thread appends a
byte to TICKS_FILE every 20 ms while Python threads can run; an InjectedException exits 3;
WAIT_S seconds without a fault exit 0.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from resiliency.inprocess.tools import inject_fault


def _tick(path: str) -> None:
    with open(path, "ab", buffering=0) as out:
        while True:
            out.write(b".")
            time.sleep(0.02)


def main() -> int:
    faults = [inject_fault.Fault[name] for name in sys.argv[1].split(",")]
    keep_alive, seed, ticks, wait = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    threading.Thread(target=_tick, args=(ticks,), daemon=True).start()
    try:
        inject_fault.inject_fault(faults, (1, 2), keep_alive, 0.2, seed)
        print("armed", flush=True)
        deadline = time.monotonic() + float(wait)
        while time.monotonic() < deadline:
            time.sleep(0.01)
    except inject_fault.InjectedException as exc:
        print(f"caught InjectedException: {exc}", flush=True)
        return 3
    except ValueError as exc:
        print(f"refused: {exc}", flush=True)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
