#!/usr/bin/env bash
# Auto-resume: run ft-launcher again and again until training is finished or failures run out.
#
#   FAULT_TOL_FINISHED_FLAG_FILE=/shared/job/finished FT_MAX_FAILURES=3 \
#       examples/auto_resume.sh --nproc-per-node 2 --max-restarts 3 \
#       examples/train_ddp_heartbeats.py --ckpt-dir /shared/job/ckpt
#
# Every argument goes to ft-launcher. The training script creates the flag file when it is done;
# until then each ft-launcher run resumes from the last checkpoint. ft-launcher's exit codes:
#   0  workers exited 0 (or were stopped cleanly by a signal): run again unless the flag exists
#   3  a rank asked for ShutdownWorkload: do not requeue, stop here
#   4  this node was excluded (ExcludeThisNode, failed health check): stop here; requeue elsewhere
#   5  preempted after an emergency checkpoint: run again (it resumes from that step), no failure
#   *  a failure: counts against FT_MAX_FAILURES (default 3)
# FT_MAX_RUNS (default 20) bounds the number of runs, so a script that never creates the flag
# cannot loop forever. FT_LAUNCHER overrides the launcher command (default: ft-launcher).
set -u

flag=${FAULT_TOL_FINISHED_FLAG_FILE:?set FAULT_TOL_FINISHED_FLAG_FILE to the finished-flag path}
max_failures=${FT_MAX_FAILURES:-3}
max_runs=${FT_MAX_RUNS:-20}
read -r -a launcher <<< "${FT_LAUNCHER:-ft-launcher}"
export FAULT_TOL_FINISHED_FLAG_FILE="$flag"

failures=0
runs=0
while [ ! -e "$flag" ]; do
    if [ "$runs" -ge "$max_runs" ]; then
        echo "auto_resume: ${runs} runs and training is still not finished; giving up" >&2
        exit 1
    fi
    runs=$((runs + 1))
    echo "auto_resume: run ${runs} (failures so far: ${failures}/${max_failures})" >&2
    "${launcher[@]}" "$@"
    rc=$?
    case "$rc" in
        0) ;;
        3) echo "auto_resume: ShutdownWorkload requested; not requeueing (exit 3)" >&2; exit 3 ;;
        4) echo "auto_resume: this node was excluded from the job (exit 4)" >&2; exit 4 ;;
        5) echo "auto_resume: preempted after an emergency checkpoint; resuming (exit 5)" >&2 ;;
        *)
            failures=$((failures + 1))
            echo "auto_resume: ft-launcher failed with exit code ${rc}" >&2
            if [ "$failures" -ge "$max_failures" ]; then
                echo "auto_resume: failure budget of ${max_failures} spent; giving up" >&2
                exit "$rc"
            fi
            ;;
    esac
done
echo "auto_resume: training finished after ${runs} run(s) (${flag} exists)" >&2
