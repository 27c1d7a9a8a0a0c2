"""Run every benchmark, then print one combined table and write it as JSON and as a PNG chart.

    python benchmarks/run.py                # all benchmarks this machine can run (a few minutes)
    python benchmarks/run.py --quick        # each with minimal repeats (under a minute)
    python benchmarks/run.py straggler      # only those whose name contains "straggler"
    python benchmarks/run.py --list         # the benchmarks' names
    python benchmarks/run.py --results DIR  # write the results somewhere else

Each benchmark script prints its own detailed table and writes ``<name>.json`` into the results
folder (default benchmarks/results/). The combined table -- every figure's median, spread, number
of runs, and its target or the comparison measured in the same run -- goes to ``summary.json``
and ``summary.png`` there. GPU-only benchmarks are skipped, with a line saying so, where no GPU is
visible. The exit status is non-zero when a benchmark that ran failed or one of its figures has
no number; a figure that misses its target is shown in the table, not turned into a failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import _summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


class Benchmark:
    """One benchmark script, its arguments for a full and a quick run, and what it needs."""

    def __init__(
        self, script: str, full: list[str], quick: list[str], needs_gpu: bool = False
    ) -> None:
        self.script = script
        self.full = full
        self.quick = quick
        self.needs_gpu = needs_gpu


BENCHMARKS: dict[str, Benchmark] = {
    "ft_client": Benchmark("bench_ft_client.py", [], ["--calls", "2000", "--repeats", "3"]),
    "straggler": Benchmark("bench_straggler.py", [], ["--quick"]),
    "hang_monitor": Benchmark("bench_hang_monitor.py", ["--repeats", "7"], ["--repeats", "2"]),
    "launcher": Benchmark(
        "bench_launcher.py", ["--repeat", "5"], ["--repeat", "1", "--torchrun-hang-wait", "3"]
    ),
    "goodput": Benchmark("bench_goodput_report.py", [], ["--events", "100000", "--repeats", "1"]),
    "cupti_overhead": Benchmark(
        "bench_cupti_overhead.py",
        [],
        ["--rounds", "3", "--steps", "10", "--warmup", "5"],
        needs_gpu=True,
    ),
}
# A benchmark that runs longer than this has hung; its process group is killed.
TIME_LIMIT_S = {False: 600.0, True: 180.0}


def _gpu_visible() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch  # noqa: PLC0415 -- only to ask whether a GPU is there

    return bool(torch.cuda.is_available())


def _run_one(bench: Benchmark, out: Path, quick: bool) -> int:
    """Run one benchmark script in its own process group; return its exit status."""
    argv = [sys.executable, str(HERE / bench.script), *(bench.quick if quick else bench.full)]
    proc = subprocess.Popen([*argv, "--json", str(out)], start_new_session=True)
    try:
        return proc.wait(TIME_LIMIT_S[quick])
    except subprocess.TimeoutExpired:
        print(f"## {bench.script} ran past {TIME_LIMIT_S[quick]:.0f} s; stopping it", flush=True)
        return -signal.SIGTERM
    finally:  # also when run.py itself is stopped
        if proc.poll() is None:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a benchmark then kills what it started), SIGKILL after a grace period."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _meta(quick: bool, took: float, benchmarks: list[str]) -> dict[str, object]:
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "benchmarks": benchmarks,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "benchmark_seconds": round(took, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and the summary; return non-zero if something failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only benchmarks whose name contains one")
    parser.add_argument("--quick", action="store_true", help="minimal repeats (a smoke run)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--list", action="store_true", help="print the benchmarks' names")
    args = parser.parse_args(argv)
    if args.list:
        for name, bench in BENCHMARKS.items():
            print(f"{name}  ({bench.script}{', needs a GPU' if bench.needs_gpu else ''})")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the running benchmark

    results: Path = args.results
    results.mkdir(parents=True, exist_ok=True)
    wanted = [n for n in BENCHMARKS if not args.names or any(a in n for a in args.names)]
    gpu = _gpu_visible()
    if not wanted:
        parser.error(f"no benchmark matches {args.names}; see --list")
    failed: list[str] = []
    ran: set[str] = set()
    selected: list[str] = []
    started = time.monotonic()
    for name in wanted:
        bench = BENCHMARKS[name]
        if bench.needs_gpu and not gpu:
            print(f"\n## {name}: skipped (needs an NVIDIA GPU; none is visible)", flush=True)
            continue
        selected.append(name)
        out = results / f"{name}.json"
        out.unlink(missing_ok=True)  # a failed run must not leave the previous numbers behind
        print(f"\n## {name}  ({bench.script}, results in {out})", flush=True)
        start = time.monotonic()
        code = _run_one(bench, out, args.quick)
        print(f"## {name}: exit {code} after {time.monotonic() - start:.1f} s", flush=True)
        if code != 0 or not out.is_file():
            failed.append(name)
        else:
            ran.add(name)
    took = time.monotonic() - started

    figures = _summary.collect(results, ran)
    meta = _meta(args.quick, took, selected)
    summary_json = results / "summary.json"
    _summary.write_json(summary_json, figures, meta, selected)
    subtitle = f"{meta['cpus']} CPUs, Python {meta['python']}, {meta['date']}" + (
        " (quick run: minimal repeats)" if args.quick else ""
    )
    chart = results / "summary.png"
    chart.unlink(missing_ok=True)
    try:
        import _chart  # noqa: PLC0415 -- matplotlib is needed for the chart only
    except ImportError as exc:
        print(f"\nno chart: {exc} (install matplotlib)")
    else:
        _chart.draw(figures, chart, subtitle)

    print(f"\n# Combined results ({'quick run, ' if args.quick else ''}{took:.0f} s of benchmarks)")
    print(_summary.table(figures))
    print(f"\nwritten: {summary_json}" + (f", {chart}" if chart.is_file() else ""))
    missing = _summary.missing(figures, selected)
    if missing:
        print(f"figures with no number: {', '.join(missing)}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
