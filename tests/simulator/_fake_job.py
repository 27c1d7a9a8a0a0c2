"""A stand-in launcher for injector tests: starts ranks with torchelastic's env, like a launcher.

    python _fake_job.py DIR NRANKS           # the "launcher": spawns NRANKS workers, waits
    python _fake_job.py --worker DIR         # one worker: ticks two counters, has a child

Each worker writes ``DIR/rank<R>.main`` (main thread ticks) and ``DIR/rank<R>.thread``
(background thread ticks) every 20 ms, and starts one grandchild (a data-loader stand-in).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def _tick(path: Path, stop: threading.Event) -> None:
    n = 0
    tmp = path.with_name(path.name + ".tmp")
    while not stop.is_set():
        n += 1
        tmp.write_text(str(n))
        os.replace(tmp, path)  # a reader never sees the file empty, mid-rewrite
        time.sleep(0.02)


def worker(out: Path) -> None:
    rank = os.environ["RANK"]
    if os.environ.get("RESILIENCY_FAULT_HOOK") == "1":
        from resiliency.ft import install_fault_hook  # noqa: PLC0415 (only with the hook)

        install_fault_hook()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (out / f"rank{rank}.child").write_text(str(child.pid))
    stop = threading.Event()
    threading.Thread(target=_tick, args=(out / f"rank{rank}.thread", stop), daemon=True).start()
    (out / f"rank{rank}.ready").write_text(str(os.getpid()))
    try:
        _tick(out / f"rank{rank}.main", stop)
    finally:
        child.kill()


def launcher(out: Path, nranks: int) -> None:
    procs = []
    for rank in range(nranks):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(out)], env=env))
    for proc in procs:
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]))
    else:
        launcher(Path(sys.argv[1]), int(sys.argv[2]))
