#!/usr/bin/env bash
# The learning benchmark's tuning sweep and report runs (issue 12), as `clawrl bench learn`
# invocations run two at a time (each server and trainer uses one thread, so two runs keep a
# 2-core machine busy). Every trained arm gets the same sweep: the same three settings on the
# same tuning seeds. Afterwards `benchmarks/learn_merge.py` picks each arm's best settings from
# the tuning runs and merges the report runs into one report.
#
#   benchmarks/learn_sweep.sh tune   OUT   # 3 settings x {rl, opd, combine} on tuning seeds
#   benchmarks/learn_sweep.sh report OUT SETTINGS_JSON  # every arm on the report seeds caught
#                                          # up, the trained single arms also --no-catch-up,
#                                          # each with its settings
# CLAWRL may name the `clawrl` to run, e.g. a wrapper that sets PYTHONPATH to a clean worktree
# of a fixed commit, so that edits to the working tree during the runs cannot reach them.
set -euo pipefail

PARALLEL=${PARALLEL:-2}
CLAWRL=${CLAWRL:-.venv/bin/clawrl}
TUNING_SEEDS=${TUNING_SEEDS:-100-101}
REPORT_SEEDS=${REPORT_SEEDS:-10-14}
# The --no-catch-up runs: fewer seeds and no memory_combine, to fit the session's time.
NO_CATCH_UP_SEEDS=${NO_CATCH_UP_SEEDS:-10-12}
# The noisy user of every reported run, and of the tuning runs, so that settings are tuned for it.
NOISE=(--user-wrong-rate 0.1 --user-quiet-rate 0.2 --user-vague-rate 0.2 --user-move-on-rate 0.1)
# The sweep: name and trainer flags. The first is the benchmark's default (BENCH_TRAIN_DEFAULTS).
SETTINGS=(
  "lr5e-4_kl0.3|--lr 5e-4 --kl-beta 0.3"
  "lr1e-3_kl0.3|--lr 1e-3 --kl-beta 0.3"
  "lr1e-3_kl0.1|--lr 1e-3 --kl-beta 0.1"
)

mode=${1:?tune or report}
out=${2:?output directory}
mkdir -p "$out"

jobs_file=$(mktemp)
trap 'rm -f "$jobs_file"' EXIT

add_job() {  # add_job DIR ARGS...: one `clawrl bench learn` invocation writing to DIR
  local dir=$1; shift
  printf '%s\t%s\n' "$dir" "$*" >>"$jobs_file"
}

case $mode in
  tune)
    for arm in combine rl opd; do
      for setting in "${SETTINGS[@]}"; do
        name=${setting%%|*}; flags=${setting#*|}
        add_job "$out/$arm/$name" --method "$arm" --seed-list "$TUNING_SEEDS" $flags "${NOISE[@]}"
      done
    done
    ;;
  report)
    chosen=${3:?settings JSON from learn_merge.py --pick}
    for catch in catch-up no-catch-up; do
      for arm in none memory combine rl opd memory_combine; do
        seeds=$REPORT_SEEDS
        if [[ $catch == no-catch-up ]]; then
          # nothing trains in none and memory: catching up changes nothing
          [[ $arm == none || $arm == memory || $arm == memory_combine ]] && continue
          seeds=$NO_CATCH_UP_SEEDS
        fi
        flags=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen'].get(sys.argv[2], ''))" "$chosen" "$arm")
        add_job "$out/$catch/$arm" --method "$arm" --seed-list "$seeds" --$catch $flags "${NOISE[@]}"
      done
    done
    ;;
  *) echo "unknown mode $mode (tune or report)" >&2; exit 2 ;;
esac

run_job() {  # run_job DIR ARGS: skip a run whose results.json exists, so a stopped sweep resumes
  local dir=$1; shift
  if [[ -f $dir/results.json ]]; then echo "done already: $dir"; return; fi
  mkdir -p "$dir"
  echo "start $(date +%T): $dir"
  # shellcheck disable=SC2086
  "$CLAWRL" bench learn --out "$dir" $* >"$dir.log" 2>&1 || echo "FAILED: $dir (see $dir.log)"
  echo "end   $(date +%T): $dir"
}
export -f run_job
export CLAWRL

tr '\t' '\n' <"$jobs_file" | xargs -d '\n' -n 2 -P "$PARALLEL" bash -c 'run_job "$0" $1'
