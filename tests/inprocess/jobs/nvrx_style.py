"""A training script shaped like NVIDIA resiliency extension's in-process examples, on our import.

NVRx's examples (``examples/inprocess/basic_example.py`` and ``optimal_example.py``) are what
its users start from, so their shape is what a user coming from NVRx brings:

* ``basic``: the whole ``main()`` is wrapped. Each call creates its own TCPStore at
  ``MASTER_PORT + 1`` (rank 0 hosts it, ``multi_tenant=True``), its process group, model and
  optimizer, and reloads the newest ``torch.save`` checkpoint. The Wrapper's own store is put at
  ``MASTER_PORT + 2`` through ``store_kwargs``, and ``health_check`` is
  ``inprocess.health_check.CudaHealthCheck()`` (which must pass on a machine with no GPU).
* ``optimal``: the store, model and optimizer are made once, outside the wrapped ``train()``,
  which gets them as arguments and forms each call's group on a ``PrefixStore`` named by
  ``call_wrapper.iteration``. With ``--nested-restarter`` (NVRx's ``advanced_example.py``) the
  Wrapper also gets the nested restarter's ``initialize``, ``abort`` (composed with
  ``AbortTorchDistributed``), ``completion`` and ``terminate`` callbacks.

Both save every ``--chkpt-interval`` iterations from rank 0 inside ``call_wrapper.atomic()`` after
a barrier, as the examples do. ``--fault RANK@ITER`` raises once, in the first call, on that
rank at that training iteration (in every call with ``--fault-every-call``: a fault that
repeats). Each rank appends JSON lines to ``--out/rank{R}.jsonl``: a
``start`` per call (the call's restart ``iteration``, the training ``step`` it resumes from, its
pid) and a ``done`` with the final parameters. Each iteration's batch is drawn from a generator
seeded by the iteration and the rank, so a resumed run trains on the unbroken run's data.

    torchrun --nproc-per-node 4 nvrx_style.py --mode basic --fault 2@30 --out DIR --path DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import pathlib

import torch

import resiliency.inprocess as inprocess

faulted = False  # a process-wide flag: the fault is injected once, whatever the restarts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["basic", "optimal"], required=True)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chkpt-interval", type=int, default=20)
    parser.add_argument("--total-iterations", type=int, default=60)
    parser.add_argument("--fault", default=None, help="RANK@ITER: raise there, once")
    parser.add_argument("--path", required=True, help="folder of the checkpoint file")
    parser.add_argument("--out", required=True, help="folder of the per-rank records")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--nested-restarter", action="store_true")
    parser.add_argument("--fault-every-call", action="store_true")
    return parser.parse_args()


def record(args: argparse.Namespace, **fields: object) -> None:
    rank = int(os.environ["RANK"])
    with open(pathlib.Path(args.out) / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps({"rank": rank, "pid": os.getpid(), **fields}) + "\n")


def backend_of(args: argparse.Namespace) -> tuple[torch.device, str, datetime.timedelta]:
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        return torch.device("cuda"), "nccl", datetime.timedelta(seconds=150)
    return torch.device("cpu"), "gloo", datetime.timedelta(seconds=10)


def make_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(1234)
    layers = [torch.nn.Linear(args.size, args.size) for _ in range(args.layers)]
    return torch.nn.Sequential(*layers).to(device)


def app_store(args: argparse.Namespace) -> torch.distributed.TCPStore:
    # beside torchrun's store at MASTER_PORT, as the examples place it
    return torch.distributed.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]) + 1,
        world_size=int(os.environ["WORLD_SIZE"]),
        is_master=int(os.environ["RANK"]) == 0,
        multi_tenant=True,
        wait_for_workers=True,
        use_libuv=True,
    )


def train_loop(
    args: argparse.Namespace,
    call_wrapper: inprocess.CallWrapper,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    device: torch.device,
) -> None:
    global faulted
    rank = int(os.environ["RANK"])
    model_ddp = torch.nn.parallel.DistributedDataParallel(model)
    checkpoint_path = pathlib.Path(args.path) / "checkpoint.pt"
    start = 0
    if checkpoint_path.exists():
        checkpoint = torch.load(checkpoint_path)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
        start = checkpoint["iteration"]
    record(args, event="start", iteration=call_wrapper.iteration, step=start)
    for iteration in range(start, args.total_iterations):
        if iteration % args.chkpt_interval == args.chkpt_interval - 1:
            torch.distributed.barrier()
            if rank == 0:
                checkpoint = {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "iteration": iteration,
                }
                with call_wrapper.atomic():
                    torch.save(checkpoint, checkpoint_path)
        once = not faulted or args.fault_every_call
        if args.fault and once and args.fault == f"{rank}@{iteration}":
            faulted = True
            raise RuntimeError(f"example fault at {iteration=} from {rank=}")
        generator = torch.Generator().manual_seed(iteration * 1000 + rank)
        inp = torch.rand(args.size, args.size, generator=generator).to(device)
        model.zero_grad()
        model_ddp(inp).square().mean().backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    record(args, event="done", params=params.tolist())


@inprocess.Wrapper(
    store_kwargs={"port": int(os.getenv("MASTER_PORT", "29500")) + 2},
    health_check=inprocess.health_check.CudaHealthCheck(),
)
def main_basic(call_wrapper: inprocess.CallWrapper | None = None) -> None:
    assert call_wrapper is not None
    args = parse_args()
    device, backend, timeout = backend_of(args)
    model = make_model(args, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    store = app_store(args)
    torch.distributed.init_process_group(
        backend=backend,
        store=store,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
    train_loop(args, call_wrapper, model, opt, device)


def train_optimal(
    base_store: torch.distributed.Store,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    backend: str,
    device: torch.device,
    timeout: datetime.timedelta,
    args: argparse.Namespace,
    call_wrapper: inprocess.CallWrapper | None = None,
) -> None:
    assert call_wrapper is not None
    store = torch.distributed.PrefixStore(str(call_wrapper.iteration), base_store)
    torch.distributed.init_process_group(
        backend,
        store=store,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
    train_loop(args, call_wrapper, model, opt, device)


def main() -> None:
    args = parse_args()
    logging.basicConfig(
        format=f"rank {os.environ['RANK']} | %(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=logging.INFO,
    )
    if args.mode == "basic":
        main_basic()
        return
    device, backend, timeout = backend_of(args)
    model = make_model(args, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    wrapper_kwargs: dict = {
        "store_kwargs": {"port": int(os.getenv("MASTER_PORT", "29500")) + 2},
        "health_check": inprocess.health_check.CudaHealthCheck(),
    }
    if args.nested_restarter:
        nested = inprocess.nested_restarter
        wrapper_kwargs["initialize"] = nested.NestedRestarterHandlingCompleted()
        wrapper_kwargs["abort"] = inprocess.Compose(
            inprocess.abort.AbortTorchDistributed(), nested.NestedRestarterHandlingStarting()
        )
        wrapper_kwargs["completion"] = nested.NestedRestarterFinalized()
        wrapper_kwargs["terminate"] = nested.NestedRestarterAborted()
    wrapped = inprocess.Wrapper(**wrapper_kwargs)(train_optimal)
    wrapped(app_store(args), model, opt, backend, device, timeout, args)


if __name__ == "__main__":
    main()
