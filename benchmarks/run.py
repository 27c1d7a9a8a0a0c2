"""Run every benchmark, print each one's table, and keep their JSON under benchmarks/results/.

    python benchmarks/run.py            # all benchmarks this machine can run
    python benchmarks/run.py straggler  # only those whose name contains "straggler"

GPU-only benchmarks are skipped, with a line saying so, where no GPU is visible.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# name -> (script, extra arguments, needs a GPU)
BENCHMARKS: dict[str, tuple[str, list[str], bool]] = {
    "ft_client": ("bench_ft_client.py", [], False),
    "straggler": ("bench_straggler.py", [], False),
    "launcher": ("bench_launcher.py", ["--repeat", "3"], False),
    "cupti_overhead": ("bench_cupti_overhead.py", [], True),
}


def _gpu_visible() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch  # noqa: PLC0415 -- only to ask whether a GPU is there

    return bool(torch.cuda.is_available())


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; return non-zero if any of them failed."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    wanted = [n for n in BENCHMARKS if not argv or any(a in n for a in argv)]
    gpu = _gpu_visible()
    failed: list[str] = []
    for name in wanted:
        script, extra, needs_gpu = BENCHMARKS[name]
        if needs_gpu and not gpu:
            print(f"\n## {name}: skipped (needs an NVIDIA GPU; none is visible)", flush=True)
            continue
        out = RESULTS / f"{name}.json"
        print(f"\n## {name}  ({script}, results in {out.relative_to(HERE.parent)})", flush=True)
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(HERE / script), *extra, "--json", str(out)], check=False
        )
        print(f"## {name}: exit {proc.returncode} after {time.monotonic() - start:.1f} s")
        if proc.returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
