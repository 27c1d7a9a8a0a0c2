"""Time to heal a rank's model and optimizer state from a peer's memory, by state size.

4 gloo ranks under torchrun, one process group; per size, a model of that many MB of fp32
parameters with SGD momentum (so the state is twice that), stepped once on every rank. Then:

* agreement only: ``Healer.heal()`` when every rank is at the same step (what each restart
  pays when nothing was lost);
* heal: rank 2's state is invalidated and ``heal()`` sends it from a peer, checksummed and
  verified (the slowest rank's time, median of ``--repeat``);
* for comparison, in the same run: rank 2 reads the same state with ``torch.load`` from a file
  rank 0 wrote with ``torch.save`` (in the page cache: the best case of reloading from local
  disk; no checksum) and loads it.

    python benchmarks/bench_heal.py [--mb 1 16 64] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from resiliency.inprocess import Healer

out, tmp, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
sizes = [int(x) for x in sys.argv[4:]]
dist.init_process_group("gloo", timeout=timedelta(seconds=300))
rank = dist.get_rank()

def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())

for mb in sizes:
    count = mb * (1 << 20) // 4
    model = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.full((count // 8,), float(i))) for i in range(8)]
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    healer = Healer({"model": model, "optimizer": opt}, step=1)
    agree, heal, load = [], [], []
    for _ in range(repeat):
        agree.append(slowest(healer.heal().seconds))
        if rank == 2:
            healer.invalidate()
        result = healer.heal()
        assert result.step == 1 and result.receivers == (2,)
        heal.append(slowest(result.seconds))
        nbytes = int(max(result.nbytes, 0))
        path = os.path.join(tmp, f"state{mb}.pt")
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        dist.barrier()
        began = time.monotonic()
        if rank == 2:
            state = torch.load(path)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            del state
        load.append(slowest(time.monotonic() - began))
        dist.barrier()
    sent = torch.tensor([nbytes], dtype=torch.int64)
    dist.all_reduce(sent, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out, "a") as f:
            f.write(json.dumps({"mb_params": mb, "state_bytes": int(sent.item()),
                                "agree_s": agree, "heal_s": heal, "torch_load_s": load}) + "\n")
    del healer, opt, model
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-heal-") as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        out = Path(tmp) / "out.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "4",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(worker),
            str(out),
            tmp,
            str(args.repeat),
            *map(str, args.mb),
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, env=env, timeout=900, check=False)
        if proc.returncode != 0:
            print(f"torchrun exited {proc.returncode}", file=sys.stderr)
            return 1
        rows = [json.loads(x) for x in out.read_text().splitlines()]
    print(f"load average {os.getloadavg()[0]:.1f}; 4 gloo ranks; median of {args.repeat}")
    print("| params | state sent | agreement only | heal (verified) | MB/s | torch.load |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        heal = statistics.median(row["heal_s"])
        mb = row["state_bytes"] / 2**20
        print(
            f"| {row['mb_params']} MB | {mb:.1f} MB | {statistics.median(row['agree_s']):.3f} s "
            f"| {heal:.3f} s | {mb / heal:.0f} | {statistics.median(row['torch_load_s']):.3f} s |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
