"""A gloo rank that all-reduces in a loop; on the faulty node it stops itself, once per job.

The faulty node is picked by FT_TEST_FAULT_NODE=1 (the rendezvous assigns the ranks). At
--fault-step that rank writes marker stopped-<rank>-<attempt>, then either stops (SIGSTOP: it
cannot even dump its stacks), sleeps in C holding the GIL (--fault gil_sleep), or blocks in a read
of a FIFO nobody writes (--fault read: a stalled file system); its peers wait for it in
all_reduce. Each fault lasts until the rank is killed: should the rank ever go on past it, it
writes resumed-<rank>-<attempt> (the test fails on it: the hang it judges was not a hang).
Markers: start-<rank>-<attempt>-<pid>, done-<rank>-<attempt>.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from resiliency.ft import RankMonitorClient

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def mark(directory: Path, name: str) -> None:
    # Written aside and renamed: a test that sees the name may read the content at once.
    tmp = directory / f".{name}.tmp"
    tmp.write_text(f"{time.time()}\n")
    os.replace(tmp, directory / name)


def read_shard(path: Path) -> bytes:
    """Read a 'shard' that never comes: opening a FIFO with no writer blocks (GIL released)."""
    os.mkfifo(path)
    with open(path, "rb") as shard:
        return shard.read()


def hold_gil_forever() -> NoReturn:
    """Sleep in C holding the GIL until the process is killed.

    libc's sleep() returns early when a signal is handled, and the monitor's stack-dump signal
    (faulthandler's C handler) is one: a single sleep(3600) ended at the first dump, the rank
    joined the all_reduce, its peer went on and was dumped outside the collective, and the verdict
    named no culprit. A real C-level hang (a dead lock, a spin) does not end on a signal; sleeping
    again keeps the rank at this frame for good.
    """
    libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
    while True:
        libc.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fault-step", type=int, default=3)
    parser.add_argument("--fault", default="stop", choices=["stop", "gil_sleep", "read"])
    args = parser.parse_args()
    mark(args.marker_dir, f"start-{RANK}-{ATTEMPT}-{os.getpid()}")
    # Once per job: a node that re-forms after a failure elsewhere keeps its restart count.
    done_once = any(args.marker_dir.glob("stopped-*"))
    faulty = os.environ.get("FT_TEST_FAULT_NODE") == "1" and not done_once
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    value = torch.ones(1)
    for step in range(args.steps):
        if faulty and step == args.fault_step:
            mark(args.marker_dir, f"stopped-{RANK}-{ATTEMPT}")
            if args.fault == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif args.fault == "read":
                read_shard(args.marker_dir / f"shard-{RANK}.fifo")
            else:
                hold_gil_forever()
            mark(args.marker_dir, f"resumed-{RANK}-{ATTEMPT}")
        dist.all_reduce(value)
        client.send_heartbeat()
        time.sleep(0.05)
    dist.barrier()
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    mark(args.marker_dir, f"done-{RANK}-{ATTEMPT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
