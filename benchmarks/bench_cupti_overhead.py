"""Step-time overhead of CUPTI kernel profiling on a small model's training step (GPU only).

Runs alternating rounds of training steps with the profiler off and on and prints the median
step time of each and the overhead (the median over rounds of on/off - 1, each "on" round paired
with the "off" round next to it). Rounds alternate their order so drift in clocks or temperature
falls on both sides. "On" means CUPTI collects during every ``--profile-every``-th step (1: all
of them) and the statistics are read every ``--read-every`` steps, as the straggler Detector
does at report time.

    python benchmarks/bench_cupti_overhead.py [--rounds 21] [--steps 40] [--profile-every 1]
                                              [--read-every 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from resiliency.straggler_cupti import CuptiKernelProfiler


def _transformer() -> tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(
        d_model=512, nhead=8, dim_feedforward=2048, batch_first=True, dropout=0.0
    )
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    return model, torch.randn(32, 128, 512)


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    dims = [1024] * 5
    layers: list[nn.Module] = []
    for d_in, d_out in itertools.pairwise(dims):
        layers += [nn.Linear(d_in, d_out), nn.GELU()]
    return nn.Sequential(*layers), torch.randn(256, 1024)


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "transformer-4x512": _transformer,
    "mlp-4x1024": _mlp,
}


def _make_step(name: str) -> Callable[[], None]:
    model, batch = MODELS[name]()
    model = model.cuda()
    batch = batch.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(batch).float().pow(2).mean()
        loss.backward()
        opt.step()

    return step


def _round(
    step: Callable[[], None],
    steps: int,
    profiler: CuptiKernelProfiler | None,
    profile_every: int,
    read_every: int,
) -> tuple[float, int]:
    """Seconds per step over one round, and the kernels the profiler saw (0 when off)."""
    kernels = 0
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for i in range(1, steps + 1):
        profiled = profiler is not None and i % profile_every == 0
        if profiled:
            profiler.start()
        step()
        if profiled:
            profiler.stop()
        if profiler is not None and i % read_every == 0:
            kernels += sum(s.count for s in profiler.read_and_reset().values())
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - begin
    if profiler is not None:
        kernels += sum(s.count for s in profiler.read_and_reset().values())
    return elapsed / steps, kernels


def measure(
    name: str, args: argparse.Namespace, profiler: CuptiKernelProfiler
) -> dict[str, float | int | str]:
    """Alternate off/on rounds of one model's training step; return the step times."""
    step = _make_step(name)
    _round(step, args.warmup, None, args.profile_every, args.read_every)
    _round(step, args.warmup, profiler, args.profile_every, args.read_every)
    off: list[float] = []
    on: list[float] = []
    kernels_per_step: list[float] = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for profiled in order:
            t, kernels = _round(
                step,
                args.steps,
                profiler if profiled else None,
                args.profile_every,
                args.read_every,
            )
            (on if profiled else off).append(t)
            if profiled:
                kernels_per_step.append(kernels / args.steps)
    pairs = sorted((b / a - 1) * 100 for a, b in zip(off, on, strict=True))
    off_ms = statistics.median(off) * 1e3
    on_ms = statistics.median(on) * 1e3
    k = statistics.median(kernels_per_step)
    overhead = statistics.median(pairs)
    return {
        "model": name,
        "step_ms_off": off_ms,
        "step_ms_on": on_ms,
        "overhead_pct": overhead,
        "overhead_pct_q1": pairs[len(pairs) // 4],
        "overhead_pct_q3": pairs[(3 * len(pairs)) // 4],
        "profiled_kernels_per_step": k,
        "overhead_us_per_profiled_kernel": (
            overhead / 100 * off_ms * 1e3 / k if k else float("nan")
        ),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "profile_every": args.profile_every,
        "read_every": args.read_every,
    }


def control_costs(profiler: CuptiKernelProfiler, n: int = 200) -> dict[str, float]:
    """Microseconds per start()+stop() pair and per read_and_reset() with an idle GPU."""
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(n):
        profiler.start()
        profiler.stop()
    toggle_us = (time.perf_counter() - begin) / n * 1e6
    begin = time.perf_counter()
    for _ in range(n):
        profiler.read_and_reset()
    read_us = (time.perf_counter() - begin) / n * 1e6
    return {"start_stop_us": toggle_us, "read_and_reset_us": read_us}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=40, help="training steps per round")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--profile-every", type=int, default=1, help="collect during every N-th step (1: all)"
    )
    parser.add_argument("--read-every", type=int, default=40, help="read_and_reset every N steps")
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_cupti_overhead: needs a CUDA GPU; none is available", file=sys.stderr)
        return 2
    names = list(MODELS) if args.model == "all" else [args.model]
    profiler = CuptiKernelProfiler()
    try:
        costs = control_costs(profiler)
        results = [measure(n, args, profiler) for n in names]
        dropped = profiler.dropped_records()
    finally:
        profiler.shutdown()
    print(
        f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  rounds={args.rounds} "
        f"steps/round={args.steps} profile_every={args.profile_every} "
        f"read_every={args.read_every}"
    )
    header = (
        f"{'model':<20} {'off ms/step':>12} {'on ms/step':>11} {'overhead':>9} "
        f"{'IQR of pairs':>17} {'kernels/step':>13} {'us/kernel':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['model']:<20} {r['step_ms_off']:>12.3f} {r['step_ms_on']:>11.3f} "
            f"{r['overhead_pct']:>8.2f}% "
            f"{r['overhead_pct_q1']:>7.2f}..{r['overhead_pct_q3']:<6.2f}% "
            f"{r['profiled_kernels_per_step']:>13.1f} {r['overhead_us_per_profiled_kernel']:>10.3f}"
        )
    print(f"records dropped: {dropped}")
    print(
        f"start()+stop(): {costs['start_stop_us']:.1f} us; "
        f"read_and_reset() on an idle GPU: {costs['read_and_reset_us']:.1f} us"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "dropped": dropped,
                    "control_costs": costs,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
