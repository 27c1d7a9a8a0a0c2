"""Checkpoint tiers: local save with a replica vs without, vs persistent; restore by tier.

    python benchmarks/bench_checkpoint_tiers.py                 # 1 GiB per rank, 2 ranks
    python benchmarks/bench_checkpoint_tiers.py --mib 256       # smaller
    python benchmarks/bench_checkpoint_tiers.py --json out/     # also write checkpoint_tiers.json

Two gloo ranks on this machine play two nodes (``GROUP_RANK`` 0 and 1), each with its own local
tier under /dev/shm; the persistent tier is a directory on disk. Each rank's state is ``--mib``
MiB of fp32 tensors keyed per rank (so every tier writes the same bytes per rank).

The persistent tier is throttled to ``--persistent-mbps`` MB/s per rank, the share of a shared
file system one client typically gets, for this benchmark only: a ``sitecustomize`` module put
on the ranks' (and their writer processes') ``PYTHONPATH`` wraps DCP's file streams under the
persistent directory in a token bucket (every read or write of n bytes first waits until the
bucket has let n bytes through at that rate). Local-tier files are never throttled.

Figures (the slower rank of the two; the local saves: the median of ``--repeat`` saves in a row,
after a warm-up save, as a job's periodic saves run; the first save into fresh memory pages pays
for the pages, up to twice as long on this machine):
- blocked: time ``save`` keeps the training loop; durable: until ``wait`` returns (committed).
- local save without a replica, with one replica (sent over gloo to the other "node"),
  persistent save of the same state (throttled).
- restore from each rank's own local copy, from a peer replica (node 1's local dir wiped), and
  from the persistent tier (both local dirs wiped; throttled).
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_SITECUSTOMIZE = """
import os, time
_PREFIX = os.environ.get("BENCH_THROTTLE_PREFIX")
_RATE = float(os.environ.get("BENCH_THROTTLE_MBPS", "0")) * 1e6
if _PREFIX and _RATE > 0:
    import contextlib
    from torch.distributed.checkpoint import filesystem as _fs
    _next = [time.monotonic()]
    def _take(n):
        now = time.monotonic()
        _next[0] = max(_next[0], now) + n / _RATE
        if _next[0] > now:
            time.sleep(_next[0] - now)
    class _Slow:
        def __init__(self, raw):
            self._raw = raw
        def __getattr__(self, name):
            return getattr(self._raw, name)
        def __enter__(self):
            return self
        def __exit__(self, *a):
            return self._raw.__exit__(*a)
        def read(self, n=-1):
            data = self._raw.read(n)
            _take(len(data))
            return data
        def readinto(self, b):
            n = self._raw.readinto(b)
            _take(n or 0)
            return n
        def write(self, b):
            n = self._raw.write(b)
            _take(n or 0)
            return n
    def _wrap(original):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            with original(self, path, mode) as stream:
                yield _Slow(stream) if str(path).startswith(_PREFIX) else stream
        return create_stream
    _fs.FileSystem.create_stream = _wrap(_fs.FileSystem.create_stream)
    from resiliency.checkpoint._dcp import planning as _dcp
    _dcp.ChecksumFileSystem.create_stream = _wrap(_dcp.ChecksumFileSystem.create_stream)
"""


def _cpu_seconds(root: int) -> float:
    """CPU time (user + system) used so far by process ``root`` and its live descendants (the
    rank and its checkpoint writers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(child for child, (parent, _) in stats.items() if parent == pid)
    return total


def rank_main(args: argparse.Namespace) -> int:
    """One rank: the whole sequence of measurements; rank 0 prints the JSON result."""
    from datetime import timedelta  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from resiliency.checkpoint import CheckpointManager, LocalTier, PersistentTier  # noqa: PLC0415

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    base = Path(args.base)
    local = base / f"node{rank}"
    n = 16
    numel = args.mib * (1 << 20) // 4 // n
    gen = torch.Generator().manual_seed(rank)
    state = {f"r{rank}.w{i}": torch.randn(numel, generator=gen) for i in range(n)}
    out: dict[str, Any] = {}

    def slowest(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def timed_save(mgr: CheckpointManager, steps: range, tier: str | None, name: str) -> None:
        blocked, durable, cpu = [], [], []
        for step in steps:
            dist.barrier()
            t0, c0 = time.monotonic(), _cpu_seconds(os.getpid())
            handle = mgr.save(step, state, tier=tier)
            blocked.append(slowest(time.monotonic() - t0))
            handle.wait()
            durable.append(slowest(time.monotonic() - t0))
            cpu.append(slowest(_cpu_seconds(os.getpid()) - c0))
        out[f"{name}_blocked_s"] = statistics.median(blocked)
        out[f"{name}_durable_s"] = statistics.median(durable)
        out[f"{name}_durable_all_s"] = durable
        out[f"{name}_cpu_s"] = statistics.median(cpu)

    def timed_load(mgr: CheckpointManager, name: str) -> int | None:
        # Allocated and written, as a restarted job's model and optimizer are before they load:
        # the first touch of fresh pages is the job's start-up, not the restore.
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        dist.barrier()
        t0 = time.monotonic()
        step = mgr.load(target)
        out[f"{name}_s"] = slowest(time.monotonic() - t0)
        assert all(torch.equal(target[k], v) for k, v in state.items()), name
        return step

    # 1. Local tier without a replica.
    reps = range(2, 2 + args.repeat)
    plain = CheckpointManager(
        None, tiers=[LocalTier(base / f"norep{rank}", replicas=0, keep_last=1)]
    )
    plain.save(1, state, tier="local").wait()  # warm-up: writer start, arena allocation
    timed_save(plain, reps, "local", "local_norep")
    plain.close()
    shutil.rmtree(base / f"norep{rank}", ignore_errors=True)

    # 2. Local with one replica, and persistent, through one tiered manager.
    mgr = CheckpointManager(
        None,
        tiers=[
            LocalTier(local, replicas=1, keep_last=1),
            PersistentTier(base / "persistent", every=10**9, keep_last=1),
        ],
    )
    mgr.save(1, state, tier="local").wait()
    mgr.save(1, state, tier="persistent").wait()
    dist.barrier()
    shutil.rmtree(local / "step_000000001")  # keep /dev/shm to one step (memory)
    timed_save(mgr, range(2, 3), "persistent", "persistent")
    last = 2 + args.repeat
    timed_save(mgr, range(3, last + 1), "local", "local_replica")

    # 3. Restores.
    assert timed_load(mgr, "restore_own_local") == last
    dist.barrier()
    if rank == 1:
        shutil.rmtree(local)
        local.mkdir()
    assert timed_load(mgr, "restore_peer_replica") == last
    dist.barrier()
    shutil.rmtree(local)
    local.mkdir()
    assert timed_load(mgr, "restore_persistent") == 2
    mgr.close()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


def _row(name: str, value: float, note: str = "") -> str:
    return f"{name:<44} {value:8.3f} s  {note}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024, help="state per rank (MiB)")
    p.add_argument("--persistent-mbps", type=float, default=200.0, help="throttle, MB/s per rank")
    p.add_argument("--json", type=Path, default=None, help="directory for checkpoint_tiers.json")
    p.add_argument("--repeat", type=int, default=5, help="local saves timed (the median is shown)")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--base", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args)
    base = Path(tempfile.mkdtemp(prefix="bench-tiers-", dir="/dev/shm"))
    persistent = Path(tempfile.mkdtemp(prefix="bench-tiers-persistent-"))
    hooks = Path(tempfile.mkdtemp(prefix="bench-tiers-hooks-"))
    (hooks / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    (base / "persistent").symlink_to(persistent)
    procs = []
    try:
        port = 29000 + os.getpid() % 2000
        for rank in (0, 1):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "2",
                "GROUP_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONPATH": os.pathsep.join(
                    [str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
                "BENCH_THROTTLE_PREFIX": str(persistent.resolve()),
                "BENCH_THROTTLE_MBPS": str(args.persistent_mbps),
            }
            argv = [sys.executable, __file__, "--rank", "--base", str(base), "--mib", str(args.mib)]
            argv += ["--repeat", str(args.repeat)]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
        outputs = [proc.communicate(timeout=1800)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(persistent, ignore_errors=True)
        shutil.rmtree(hooks, ignore_errors=True)
    if any(proc.returncode for proc in procs):
        print("a rank failed:\n" + "\n".join(outputs), file=sys.stderr)
        return 1
    line = next(x for x in outputs[0].splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    ratio = r["local_replica_durable_s"] / r["local_norep_durable_s"]
    speedup = r["restore_persistent_s"] / r["restore_own_local_s"]
    print(f"checkpoint tiers: {args.mib} MiB per rank, 2 gloo ranks as 2 nodes, local tier in")
    print(f"/dev/shm, persistent on disk throttled to {args.persistent_mbps:g} MB/s per rank")
    print(_row("local save, no replica: blocked", r["local_norep_blocked_s"]))
    print(_row("local save, no replica: durable", r["local_norep_durable_s"]))
    print(_row("local save, no replica: CPU per rank", r["local_norep_cpu_s"], "rank + writer"))
    print(_row("local save + 1 replica: blocked", r["local_replica_blocked_s"]))
    print(
        _row(
            "local save + 1 replica: durable",
            r["local_replica_durable_s"],
            f"{ratio:.2f}x no replica (target <= 1.5x)",
        )
    )
    # Both ranks' CPU time on this host's cores: no order of the work finishes sooner.
    floor = 2 * r["local_replica_cpu_s"] / (os.cpu_count() or 1)
    print(_row("local save + 1 replica: CPU per rank", r["local_replica_cpu_s"], "rank + writer"))
    print(
        _row(
            f"  lower bound on {os.cpu_count()} cores",
            floor,
            f"{floor / r['local_norep_durable_s']:.2f}x no replica, however overlapped",
        )
    )
    print(_row("persistent save (throttled): blocked", r["persistent_blocked_s"]))
    print(_row("persistent save (throttled): durable", r["persistent_durable_s"]))
    print(_row("restore from own local copy", r["restore_own_local_s"]))
    print(_row("restore via peer replica (node 1 wiped)", r["restore_peer_replica_s"]))
    print(
        _row(
            "restore from persistent (throttled)",
            r["restore_persistent_s"],
            f"{speedup:.1f}x own local (target >= 3x)",
        )
    )
    r.update(
        mib_per_rank=args.mib,
        persistent_mbps=args.persistent_mbps,
        replica_over_norep=ratio,
        replica_cpu_floor_s=floor,
        persistent_over_local_restore=speedup,
    )
    if args.json is not None:
        args.json.mkdir(parents=True, exist_ok=True)
        (args.json / "checkpoint_tiers.json").write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
