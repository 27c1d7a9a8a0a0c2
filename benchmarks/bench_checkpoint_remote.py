"""Checkpoints to an object store: resiliency's persistent tier vs DCP's own fsspec path.

    python benchmarks/bench_checkpoint_remote.py               # 256 MiB per rank, 2 ranks
    python benchmarks/bench_checkpoint_remote.py --mib 64 --repeat 2

Needs ``pip install 'resiliency-checkpoint[remote]' s3fs 'moto[server]'``. Two gloo ranks save
the same state (``--mib`` MiB of fp32 per rank, keyed per rank) to an S3 API served by moto on
loopback, side by side in one run:

- ``CheckpointManager("s3://...")``: blocked (``save`` returns) and durable (``wait`` returns);
- ``dcp.save(state, checkpoint_id="s3://...")``: DCP's fsspec writer, what users call today;
  it blocks until the upload is done;
- ``dcp.async_save(...)``: blocked until the future is handed back, durable at ``result()``;
- restore: ``CheckpointManager.load`` (downloads what each rank reads, verified) against
  ``dcp.load(checkpoint_id="s3://...")`` (no checksum).

Figures are the slower rank's, the median of ``--repeat`` runs after a warm-up. moto keeps
objects in the memory of one Python process, so its throughput (about 100 MB/s here) bounds
every durable time: compare the rows with each other, not with a cloud store.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "checkpoint"))


def rank_main(args: argparse.Namespace) -> int:
    """One rank: every measurement in turn; rank 0 prints the JSON result."""
    from datetime import timedelta  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415

    from resiliency.checkpoint import CheckpointManager  # noqa: PLC0415

    dist.init_process_group("gloo", timeout=timedelta(seconds=900))
    rank = dist.get_rank()
    n = 8
    numel = args.mib * (1 << 20) // 4 // n
    gen = torch.Generator().manual_seed(rank)
    state = {f"r{rank}.w{i}": torch.randn(numel, generator=gen) for i in range(n)}
    url = f"s3://{args.bucket}"
    out: dict[str, Any] = {}

    def slowest(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def record(name: str, blocked: list[float], durable: list[float]) -> None:
        out[f"{name}_blocked_s"] = statistics.median(blocked)
        out[f"{name}_durable_s"] = statistics.median(durable)

    # 1. resiliency: CheckpointManager on the object store.
    mgr = CheckpointManager(f"{url}/ours", keep_last=1)
    mgr.save(0, state).wait()  # warm-up: the writer, the staging arena, the connections
    blocked, durable = [], []
    for step in range(1, args.repeat + 1):
        dist.barrier()
        t0 = time.monotonic()
        handle = mgr.save(step, state)
        blocked.append(slowest(time.monotonic() - t0))
        handle.wait()
        durable.append(slowest(time.monotonic() - t0))
    record("ours", blocked, durable)

    # 2. DCP's own fsspec writer, blocking, then asynchronous.
    dcp.save(state, checkpoint_id=f"{url}/dcp/warmup")
    for name in ("dcp_save", "dcp_async_save"):
        blocked, durable = [], []
        for i in range(args.repeat):
            dist.barrier()
            t0 = time.monotonic()
            if name == "dcp_save":
                dcp.save(state, checkpoint_id=f"{url}/dcp/{name}-{i}")
                blocked.append(slowest(time.monotonic() - t0))
            else:
                future = dcp.async_save(state, checkpoint_id=f"{url}/dcp/{name}-{i}")
                blocked.append(slowest(time.monotonic() - t0))
                assert isinstance(future, Future)  # no async stager given: a plain Future
                future.result()
            durable.append(slowest(time.monotonic() - t0))
        record(name, blocked, durable)

    # 3. Restores of the same bytes.
    for name in ("restore_ours", "restore_dcp"):
        times = []
        for _ in range(args.repeat):
            target = {k: torch.zeros_like(v) for k, v in state.items()}
            dist.barrier()
            t0 = time.monotonic()
            if name == "restore_ours":
                assert mgr.load(target) == args.repeat
            else:
                dcp.load(target, checkpoint_id=f"{url}/dcp/dcp_save-0")
            times.append(slowest(time.monotonic() - t0))
            assert all(torch.equal(target[k], v) for k, v in state.items()), name
        out[f"{name}_s"] = statistics.median(times)
    mgr.close()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


def _row(name: str, value: float, note: str = "") -> str:
    return f"{name:<40} {value:8.3f} s  {note}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=256, help="state per rank (MiB)")
    p.add_argument("--repeat", type=int, default=3, help="runs timed (the median is shown)")
    p.add_argument("--json", type=Path, default=None, help="directory for checkpoint_remote.json")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bucket", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args)
    from s3_harness import BUCKET, s3_server  # noqa: PLC0415 -- tests/checkpoint

    logs = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        with s3_server(logs) as s3_env:
            port = 31000 + os.getpid() % 2000
            for rank in (0, 1):
                env = {
                    **os.environ,
                    **s3_env,
                    "RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
                argv = [sys.executable, __file__, "--rank", "--bucket", BUCKET]
                argv += ["--mib", str(args.mib), "--repeat", str(args.repeat)]
                procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
            outputs = [proc.communicate(timeout=3000)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(logs, ignore_errors=True)
    if any(proc.returncode for proc in procs):
        print("a rank failed:\n" + "\n".join(outputs), file=sys.stderr)
        return 1
    r = json.loads(next(x for x in outputs[0].splitlines() if x.startswith("RESULT "))[7:])
    print(f"object-store checkpoints: {args.mib} MiB per rank, 2 gloo ranks, S3 API (moto) on")
    print(f"loopback; median of {args.repeat}, the slower rank")
    print(_row("resiliency save: blocked", r["ours_blocked_s"]))
    print(_row("resiliency save: durable", r["ours_durable_s"], "verified manifest committed"))
    print(_row("dcp.save (fsspec): blocked = durable", r["dcp_save_durable_s"]))
    print(_row("dcp.async_save (fsspec): blocked", r["dcp_async_save_blocked_s"]))
    print(_row("dcp.async_save (fsspec): durable", r["dcp_async_save_durable_s"]))
    print(_row("resiliency load (verified)", r["restore_ours_s"]))
    print(_row("dcp.load (fsspec, unverified)", r["restore_dcp_s"]))
    if args.json is not None:
        args.json.mkdir(parents=True, exist_ok=True)
        (args.json / "checkpoint_remote.json").write_text(
            json.dumps({**r, "mib_per_rank": args.mib, "repeat": args.repeat}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
