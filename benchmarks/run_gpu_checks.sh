#!/usr/bin/env bash
# The toolkit's GPU paths on a machine with an NVIDIA GPU and a CUDA build of torch, in one run:
#   bash benchmarks/run_gpu_checks.sh OUTDIR
# Uses the python3 on PATH as it is (no install): the pure-Python packages are put on
# PYTHONPATH from packages/*/src, and the CUPTI extension is built into OUTDIR/site. Each step
# runs even when an earlier one failed; every log and JSON result lands in OUTDIR, and the exit
# status counts the failed steps.
set -u
out=${1:?usage: run_gpu_checks.sh OUTDIR}
mkdir -p "$out"
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
src=""
for p in goodput checkpoint inprocess straggler; do src="$src:$repo/packages/$p/src"; done
export PYTHONPATH="$out/site${src}"
failed=0
step() {  # step NAME COMMAND...: run it, log to OUTDIR/NAME.log, report its time and status
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { failed=$((failed + 1)); tail -25 "$out/$name.log"; }
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
} | tee "$out/summary.txt"
[ -d /usr/local/cuda ] && export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}
step build_cupti python3 -m pip install -q --no-build-isolation --no-deps --no-index \
  --target "$out/site" packages/straggler-cupti
# every test module marked gpu, found rather than listed, so a new one is never left out
mapfile -t gpu_tests < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
echo "gpu test modules: ${gpu_tests[*]}" | tee -a "$out/summary.txt"
step tests python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --durations=10" \
  --timeout 300 --junitxml "$out/tests.xml" --continue-on-collection-errors "${gpu_tests[@]}"
for every in 1 10; do
  step "cupti_every_$every" python3 benchmarks/bench_cupti_overhead.py --rounds 11 \
    --profile-every "$every" --json "$out/cupti_every_$every.json"
done
step checkpoint_cuda python3 benchmarks/bench_checkpoint.py --device cuda --world 1 \
  --size-gib 2 --repeats 2 --ours-saves 3 --json "$out/checkpoint_cuda.json"
rm -rf "$out/site"
echo "failed steps: $failed" | tee -a "$out/summary.txt"
exit "$failed"
