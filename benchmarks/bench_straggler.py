"""Speed of resiliency.straggler: section overhead on the hot path and rank-0 scoring cost.

    python benchmarks/bench_straggler.py [--json results.json] [--quick]

Targets (issue 4): an empty CPU ``detection_section`` <= 1.5 us; scoring 4,096 ranks x 20
sections <= 100 ms on rank 0. The scoring rows time what rank 0 does after the gather: validating
every rank's frame, computing relative scores and filling the report (plus, separately, the
formulas alone). Costs are the thread's CPU time, best of several repetitions: on a shared machine
wall time also counts the time other processes held the core; wall-clock figures are given too.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from timeit import Timer

from resiliency.straggler import Detector, Report
from resiliency.straggler._aggregate import decode_all, fill_scores
from resiliency.straggler._payload import RankSummary, encode_summary
from resiliency.straggler._scoring import gpu_relative_scores, relative_scores_of_columns

SECTIONS = 20


def per_call_ns_runs(
    stmt: Callable[[], None],
    number: int,
    repeat: int,
    clock: Callable[[], float] = time.thread_time,
) -> list[float]:
    """Mean cost of one call in ns, for each of ``repeat`` repetitions of ``number`` calls."""
    timer = Timer(stmt, timer=clock)
    return [total / number * 1e9 for total in timer.repeat(repeat=repeat, number=number)]


def per_call_ns(
    stmt: Callable[[], None],
    number: int,
    repeat: int,
    clock: Callable[[], float] = time.thread_time,
) -> float:
    """Best-of-``repeat`` mean cost of one call, in ns (best: least disturbed by other load)."""
    return min(per_call_ns_runs(stmt, number, repeat, clock))


def bench_sections(number: int, repeat: int) -> list[dict]:
    Detector.initialize(report_time_interval=3600)
    section = Detector.detection_section

    def empty_loop() -> None:
        pass

    def named_cpu() -> None:
        with section("step", profile_cuda=False):
            pass

    def named_default() -> None:
        with section("step"):
            pass

    def unnamed() -> None:
        with section(profile_cuda=False):
            pass

    held = section("held", profile_cuda=False)

    def held_object() -> None:
        with held:
            pass

    Detector.set_profiling_interval(1)
    rows = []
    base = per_call_ns(empty_loop, number, repeat)
    base_wall = per_call_ns(empty_loop, number, repeat, time.perf_counter)
    for label, fn in [
        ('detection_section("step", profile_cuda=False)', named_cpu),
        ('detection_section("step") (no GPU: CPU only)', named_default),
        ("detection_section() (caller file:line)", unnamed),
        ("reused section object (with held:)", held_object),
    ]:
        runs = [cost - base for cost in per_call_ns_runs(fn, number, repeat)]
        wall = per_call_ns(fn, number, repeat, time.perf_counter) - base_wall
        rows.append(
            {
                "case": label,
                "ns_per_section": round(min(runs), 1),
                "ns_runs": [round(cost, 1) for cost in runs],
                "wall_ns": round(wall, 1),
            }
        )
    Detector.set_profiling_interval(10)
    cost = per_call_ns(named_cpu, number, repeat) - base
    wall = per_call_ns(named_cpu, number, repeat, time.perf_counter) - base_wall
    rows.append(
        {"case": "same, profiling_interval=10", "ns_per_section": round(cost, 1), "wall_ns": wall}
    )
    Detector.shutdown()
    return rows


def simulated_payloads(ranks: int, kernels: int, rng: random.Random) -> list[bytes]:
    names = [f"section_{i:02d}" for i in range(SECTIONS)]
    kernel_names = [f"kernel_{i:03d}" for i in range(kernels)]
    payloads = []
    for rank in range(ranks):
        slow = 2.0 if rank == ranks // 3 else 1.0
        summary = RankSummary(
            rank=rank,
            node=f"node{rank // 8:04d}",
            section_medians={n: rng.uniform(900.0, 1100.0) * slow for n in names},
            kernel_medians={k: (rng.uniform(9.0, 11.0) * slow, 40) for k in kernel_names},
            section_individual={n: rng.uniform(0.9, 1.0) for n in names},
            gpu_individual=rng.uniform(0.9, 1.0) if kernels else None,
        )
        payloads.append(encode_summary(summary))
    return payloads


def bench_scoring(ranks: int, kernels: int, repeat: int) -> dict:
    rng = random.Random(ranks)
    payloads = simulated_payloads(ranks, kernels, rng)
    full, wall, formulas = [], [], []
    report = Report()
    for _ in range(repeat):
        started, started_wall = time.thread_time(), time.perf_counter()
        gathered = decode_all(payloads, receiver_rank=0)
        report = Report()
        fill_scores(report, gathered, relative=True, individual=True)
        full.append(time.thread_time() - started)
        wall.append(time.perf_counter() - started_wall)
        medians, kernel_medians = gathered.section_medians(), gathered.kernel_medians()
        started = time.thread_time()
        relative_scores_of_columns(medians)
        gpu_relative_scores(kernel_medians)
        formulas.append(time.thread_time() - started)
    flagged = report.identify_stragglers()["straggler_sections_relative"]
    assert all({s.rank for s in ids} == {ranks // 3} for ids in flagged.values()), flagged
    return {
        "ranks": ranks,
        "sections": SECTIONS,
        "kernels_per_rank": kernels,
        "payload_kib_total": round(sum(map(len, payloads)) / 1024, 1),
        "rank0_ms_best": round(min(full) * 1e3, 2),
        "rank0_ms_runs": [round(value * 1e3, 3) for value in full],
        "rank0_wall_ms_median": round(statistics.median(wall) * 1e3, 2),
        "formulas_ms_best": round(min(formulas) * 1e3, 2),
    }


def bench_local_window(repeat: int) -> dict:
    """Per-rank cost of closing a window: medians of 20 sections x 1,024 samples."""
    Detector.initialize(scores_to_compute=["individual_perf_scores"], gather_on_rank0=False)
    rings = [Detector.detection_section(f"s{i}", profile_cuda=False) for i in range(SECTIONS)]
    times = []
    for _ in range(repeat):
        for ring in rings:
            for _ in range(1024):
                with ring:
                    pass
        started = time.perf_counter()
        Detector.generate_report()
        times.append(time.perf_counter() - started)
    Detector.shutdown()
    return {
        "case": "generate_report, 20 sections x 1,024 samples, no collective",
        "ms_median": round(statistics.median(times) * 1e3, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    number, repeat = (50_000, 3) if args.quick else (200_000, 7)

    sections = bench_sections(number, repeat)
    print(f"\nEmpty section cost ({number:,} calls, best of {repeat}; target <= 1500 ns)")
    print(f"{'case':<52} {'CPU ns':>8} {'wall ns':>8}")
    for row in sections:
        print(f"{row['case']:<52} {row['ns_per_section']:>8.1f} {row['wall_ns']:>8.1f}")

    scoring = [
        bench_scoring(ranks, kernels, 3 if args.quick else 7)
        for ranks, kernels in [(64, 0), (512, 0), (4096, 0), (4096, 50)]
    ]
    print("\nRank-0 work after the gather: decode + score + fill (target 4,096 x 20 <= 100 ms)")
    print(
        f"{'ranks':>6} {'sections':>8} {'kernels':>8} {'KiB':>9} {'rank0 CPU ms':>13} "
        f"{'rank0 wall ms (median)':>23} {'formulas CPU ms':>16}"
    )
    for row in scoring:
        print(
            f"{row['ranks']:>6} {row['sections']:>8} {row['kernels_per_rank']:>8} "
            f"{row['payload_kib_total']:>9} {row['rank0_ms_best']:>13} "
            f"{row['rank0_wall_ms_median']:>23} {row['formulas_ms_best']:>16}"
        )
    window = bench_local_window(3 if args.quick else 5)
    print(f"\n{window['case']}: {window['ms_median']} ms")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "python": sys.version.split()[0],
                    "machine": platform.machine(),
                    "sections": sections,
                    "scoring": scoring,
                    "local_window": window,
                },
                indent=2,
            )
        )
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
