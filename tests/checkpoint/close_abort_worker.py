"""A rank of a 2-rank gloo job closing its manager with a save in flight (``close(abort=...)``).

Usage: python rank_group.py 2 OUT DEADLINE_S CODES close_abort_worker.py ROOT MODE OUT

Both ranks commit step 1, then start saving step 2 while rank 0's writer is stopped (SIGSTOP,
as the writer-failure jobs do): step 2 stays in flight on rank 0 for as long as the job needs,
whatever the machine's load. Rank 1 leaves ``OUT/rank1.inflight`` (its writer's pid) once
its ``save(2)`` returned. Then, by MODE:

``abort``: rank 0 SIGKILLs rank 1 (its pid from rank_group's ``OUT/rank1.pid``), waits until it
    is gone, and calls ``close(abort=True)``.
``plain``: rank 0 resumes its writer (SIGCONT) and both ranks call ``close()``: the collective
    wait, which commits step 2 on both.

Rank 0 writes ``OUT/rank0.json``: how long ``close`` took, its writer's pid, the steps
committed after it, and whether the abandoned save's ``wait`` raised.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from resiliency.checkpoint import CheckpointManager, SaveFailedError

#: Every wait of this job on another process ends by this bound (with a message).
WAIT_S = 120.0


def state(step: int) -> dict[str, Any]:
    """The same values on both ranks (replicated, as a DDP model's): DCP writes them once."""
    return {"model": {"w": torch.full((4096,), float(step)), "b": torch.arange(16.0) + step}}


def _wait_for(what: str, ready: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank waited {WAIT_S:.0f} s for {what}")
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie until rank_group reaps it: dead all the same.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def run(rank: int, root: Path, mode: str, out: Path) -> None:
    mgr = CheckpointManager(root, keep_last=3, writer_timeout_s=WAIT_S)
    writer = mgr._writer
    assert writer is not None
    writer.wait_ready(writer.deadline(WAIT_S))  # a writer still starting is bypassed
    mgr.save(1, state(1)).wait()
    writer_pid = mgr.writer_pid
    assert writer_pid is not None
    if rank == 0:
        os.kill(writer_pid, signal.SIGSTOP)  # it takes step 2 but cannot write it
    handle = mgr.save(2, state(2))
    result: dict[str, Any] = {"writer_pid": writer_pid, "done_before_close": handle.done()}
    if rank == 1:
        # Whole or absent: rank 0 SIGKILLs this rank as soon as the file exists, so a file
        # created empty and written after (write_text) could be left empty (seen under load).
        (out / "rank1.inflight.tmp").write_text(str(writer_pid))
        os.replace(out / "rank1.inflight.tmp", out / "rank1.inflight")
        if mode == "abort":
            _wait_for("SIGKILL from rank 0", lambda: False)
        mgr.close()
        return
    _wait_for("rank 1's save(2)", (out / "rank1.inflight").exists)
    if mode == "abort":
        peer = int((out / "rank1.pid").read_text())
        os.kill(peer, signal.SIGKILL)
        _wait_for(f"rank 1 (pid {peer}) to die", lambda: _gone(peer))
    else:
        os.kill(writer_pid, signal.SIGCONT)
    t0 = time.monotonic()
    mgr.close(abort=mode == "abort")
    result["close_s"] = time.monotonic() - t0
    result["writer_gone"] = _gone(writer_pid)
    result["steps"] = mgr.steps()
    try:
        handle.wait()
        result["wait_error"] = None
    except SaveFailedError as exc:
        result["wait_error"] = str(exc)
    t1 = time.monotonic()
    mgr.close()  # a no-op after close(abort=True): no collective with the dead rank
    result["second_close_s"] = time.monotonic() - t1
    (out / "rank0.json").write_text(json.dumps(result))


def main() -> int:
    root, mode, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    rank = int(os.environ["RANK"])
    logging.basicConfig(
        level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s"
    )
    dist.init_process_group("gloo", timeout=timedelta(seconds=WAIT_S))  # env:// from rank_group
    run(rank, root, mode, out)
    if mode == "plain":
        dist.barrier()
        dist.destroy_process_group()
    # abort: rank 1 is dead; the group is left as an aborted job leaves it (the process exits).
    return 0


if __name__ == "__main__":
    sys.exit(main())
