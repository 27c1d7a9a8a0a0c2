"""A rank raises, or is SIGKILLed: time from the fault to every rank's next completed step,
and the steps lost.

Three setups per fault, side by side in one run, 4 gloo ranks of the same DDP job (a small MLP):

* in-process restart (``resiliency.inprocess.Wrapper``): the surviving processes keep the model
  in memory and resume at the step that failed. For a raise, under torchrun; for a SIGKILL,
  under ``ft-launcher --ft-preimport ... --ft-inprocess-respawn``, which respawns the dead
  rank alone, and ``inprocess.Healer`` sends it the state from a live peer;
* ``ft-launcher --ft-preimport torch,torch._dynamo,...``: every worker is respawned (forked from
  the fork server)
  and loads the newest checkpoint (saved every ``--ckpt-every`` steps);
* ``torchrun --max-restarts 1``: every worker is respawned anew and loads that checkpoint.

    python benchmarks/bench_inprocess.py [--faults raise,kill] [--repeat 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The launcher flags of the respawn setup are the fork-server benchmark's (run from this folder).
from bench_fork_server import FT_FLAGS

WORKER = r"""
import json, os, sys, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

out, mode = Path(sys.argv[1]), sys.argv[2]
fault_step, ckpt_every, fault = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"step": 0}
ckpt = out / "ckpt.pt"

def record(**fields):
    with open(out / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps({"rank": rank, "t": time.time(), "pid": os.getpid(), **fields}) + "\n")

def train(iteration, healer=None, call_wrapper=None):
    record(event="enter", iteration=iteration)
    if mode == "inprocess":  # a store namespace per restart iteration (see docs/inprocess.md)
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                             is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=dist.PrefixStore(f"b/{iteration}", base),
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=60))
    else:  # respawned processes: the launcher's own rendezvous, as any torchrun job does
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if healer is not None:  # a respawned rank gets the model and optimizer from a peer
        state["step"] = healer.heal(call_wrapper=call_wrapper).step
    ddp = DistributedDataParallel(model)
    while state["step"] < fault_step + 10:
        if state["step"] == fault_step and rank == 1 and attempt == 0 and iteration == 0:
            record(event="fault", step=state["step"])
            if fault == "kill":
                os.kill(os.getpid(), 9)
            raise RuntimeError("injected fault")
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(state["step"] * 10 + rank))
        opt.zero_grad(set_to_none=True)
        ddp(x).pow(2).mean().backward()
        if healer is not None:
            with healer.updating(state["step"] + 1):
                opt.step()
        else:
            opt.step()
        state["step"] += 1
        record(event="step", step=state["step"])
        if mode == "respawn" and state["step"] % ckpt_every == 0 and rank == 0:
            saved = {"model": model.state_dict(), "opt": opt.state_dict(), "step": state["step"]}
            torch.save(saved, out / "ckpt.tmp")
            os.replace(out / "ckpt.tmp", ckpt)
        time.sleep(0.05)
    dist.destroy_process_group()

if mode == "inprocess":
    import logging
    from resiliency import inprocess
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the restart lines
    wrapper = inprocess.Wrapper(monitor_thread_interval=timedelta(seconds=0.1),
                                heartbeat_interval=timedelta(seconds=0.5))
    healer = inprocess.Healer({"model": model, "opt": opt}, step=0) if fault == "kill" else None
    def run(call_wrapper: inprocess.CallWrapper | None = None):
        train(call_wrapper.iteration, healer, call_wrapper)
    wrapper(run)()
else:
    if ckpt.exists():
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"]); opt.load_state_dict(saved["opt"])
        state["step"] = saved["step"]
    record(event="resumed", step=state["step"])
    train(0)
"""

SETUPS = ("in-process", "ft-launcher --ft-preimport", "torchrun")
# What the fork server imports for both ft-launcher setups: torch, and what the worker imports
# next (building its optimizer imports torch._dynamo, 3.7 s here): a respawned rank then reaches
# its first collective in about 0.1 s instead of 4 s.
PREIMPORT = "torch,torch._dynamo,resiliency.inprocess"
FAULTS = ("raise", "kill")


def _command(
    setup: str, fault: str, script: Path, out: Path, args: argparse.Namespace
) -> list[str]:
    common = ["--nproc-per-node", str(args.nproc), "--max-restarts", "1"]
    mode = "inprocess" if setup == "in-process" else "respawn"
    if setup == "ft-launcher --ft-preimport" or (setup == "in-process" and fault == "kill"):
        head = [sys.executable, "-m", "resiliency.launcher", *common, *FT_FLAGS]
        head += ["--ft-preimport", PREIMPORT]
        if setup == "in-process":  # the dead rank respawned alone, the others in-process
            # a static rendezvous: the workers' process-group store and the Wrapper's
            # (MASTER_PORT + 1) at known ports, as under torchrun
            port = _free_port_pair()
            head += ["--ft-inprocess-respawn", "--master-addr", "127.0.0.1"]
            head += ["--master-port", str(port)]
    else:
        # torchrun's c10d rendezvous: its default restarts a gloo group into the previous
        # attempt's store keys and fails (pytorch/pytorch#135712; see _env below)
        endpoint = f"127.0.0.1:{_free_port()}"
        head = [sys.executable, "-m", "torch.distributed.run", *common, "--monitor-interval", "0.1"]
        head += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    tail = [str(args.fault_step), str(args.ckpt_every), fault]
    return [*head, str(script), str(out), mode, *tail]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_port_pair() -> int:
    """A port P with P+1 free too (the Wrapper's store), below the ephemeral range."""
    for port in range(21000, 32000, 2):
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports on 127.0.0.1 in 21000-32000")


def _env(setup: str) -> dict[str, str]:
    env = dict(os.environ)
    if setup == "torchrun":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def _run(setup: str, fault: str, workdir: Path, args: argparse.Namespace) -> dict | None:
    """One run: fault -> every rank's next completed step (s), and steps lost."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    script = workdir / "bench_inprocess_worker.py"
    script.write_text(WORKER)
    with open(out / "launcher.log", "w") as log:
        proc = subprocess.Popen(
            _command(setup, fault, script, out, args),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_env(setup),
        )
        try:
            proc.wait(600)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    records = [
        json.loads(line)
        for path in out.glob("rank*.jsonl")
        for line in path.read_text().splitlines()
        if line
    ]
    faults = [r for r in records if r["event"] == "fault"]
    if proc.returncode != 0 or not faults:
        tail = (out / "launcher.log").read_text()[-3000:]
        print(f"{setup}, {fault}: no result; log ends:\n{tail}")
        return None
    t_fault, fault_step = faults[0]["t"], faults[0]["step"]
    next_steps = []
    for rank in range(args.nproc):
        # a survivor can finish its step after the fault's record (a skew of one step), in the
        # same process: its next step is the first one after it entered training again
        mine = sorted((r for r in records if r["rank"] == rank), key=lambda r: r["t"])
        entered = next((r["t"] for r in mine if r["event"] == "enter" and r["t"] > t_fault), None)
        after = [r for r in mine if r["event"] == "step" and entered and r["t"] > entered]
        if not after:
            return None
        next_steps.append(after[0])
    resumed_from = min(r["step"] for r in next_steps) - 1
    first_pid = {r["rank"]: r["pid"] for r in sorted(records, key=lambda r: r["t"])[::-1]}
    return {
        "recovery_s": max(r["t"] for r in next_steps) - t_fault,
        "steps_lost": fault_step - resumed_from,
        # the ranks that did not fail kept their processes (a SIGKILLed rank cannot)
        "same_pids": all(
            r["pid"] == first_pid[r["rank"]] for r in next_steps if r["rank"] != faults[0]["rank"]
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--fault-step", type=int, default=12)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--faults", default=",".join(FAULTS), help="raise, kill or both")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faults = [f for f in args.faults.split(",") if f]
    if unknown := sorted(set(faults) - set(FAULTS)):
        parser.error(f"--faults: unknown {unknown}; choose from {', '.join(FAULTS)}")
    results: dict[str, list[dict | None]] = {f"{f}: {s}": [] for f in faults for s in SETUPS}
    with tempfile.TemporaryDirectory(prefix="bench-inprocess-") as tmp:
        for _ in range(args.repeat):  # alternating, so load drift falls on every setup
            for fault in faults:
                for setup in SETUPS:
                    results[f"{fault}: {setup}"].append(_run(setup, fault, Path(tmp), args))
    print(
        f"rank 1 raises (raise) or is SIGKILLed (kill) at step {args.fault_step}; {args.nproc} "
        f"gloo ranks; checkpoint every {args.ckpt_every} steps (respawn setups); in-process "
        "under torchrun (raise) or ft-launcher --ft-preimport --ft-inprocess-respawn (kill); "
        f"fault -> every rank's next completed step (median, min-max, n={args.repeat})"
    )
    for name, runs in results.items():
        done = [r for r in runs if r is not None]
        if not done:
            print(f"  {name:35s} never")
            continue
        times = [r["recovery_s"] for r in done]
        lost = sorted({r["steps_lost"] for r in done})
        pids = "others keep pids" if all(r["same_pids"] for r in done) else "new pids"
        print(
            f"  {name:35s} {statistics.median(times):7.2f} s ({min(times):.2f}-{max(times):.2f})"
            f"  steps lost {lost}  {pids}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": None}, "results": results}) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
