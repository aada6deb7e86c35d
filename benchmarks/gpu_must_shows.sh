#!/usr/bin/env bash
# The GPU measurements the open issues still need, one part per device call (each under 10 minutes on one H200):
#   tests    tests/gpu/test_run_gpu.py: perflab run on a GPU with the report made in its own process
#   clock    the host-bound compiled loop and the slow-loader trainer under perflab run, each logging its own per-step
#            clock: every iteration over 2x its neighbours' median, with the phase perflab was in (the report's
#            process should leave none after the traced steps; the step after them read 917.7 ms before)
#   floor    benchmarks/ab_floor_gpu.py: 11 vs 10 layers against the plain loop's ratio and the block-shaped truths
#   costs    benchmarks/profiler_costs_gpu.py: torch.profiler's start, stop and export on the program's thread, per session
#   batch    nanoGPT's train.py, batch 8 against 16, counted by --input get_batch: compared per token (NANOGPT=dir)
# usage: OUT=dir [NANOGPT=/path/to/nanoGPT] bash benchmarks/gpu_must_shows.sh PART...
# Results go to $OUT (the device's $OUT: they come back); docs/performance/ says where each lands.
set -u
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for part in "$@"; do
  echo "=== $part $(date +%T)" >&2
  case $part in
    tests)
      python -m pytest -q -rf -m gpu --durations=0 tests/gpu/test_run_gpu.py 2>&1 | tail -25 | tee "$OUT/tests.log" ;;
    clock)
      OUT="$OUT/clock" ONLY="${CLOCK_ONLY:-sync slow}" bash benchmarks/run_whole_loop_gpu.sh
      for name in ${CLOCK_ONLY:-sync slow}; do
        python - "$OUT/clock/${name}_own.jsonl" <<'EOF' | tee "$OUT/clock_${name}.txt"
import json, sys
sys.path.insert(0, "benchmarks")
from own_clock_cpu import spikes
rows = [json.loads(line) for line in open(sys.argv[1])]
key = "step_ms" if "step_ms" in rows[0] else "batch_ms"
own = [r[key] for r in rows]
print(sys.argv[1], "iterations", len(own), "over 2x their neighbours (iteration 0 is the program's start):")
for s in spikes(own, 2.0):
    print(" ", s)
run = json.load(open(sys.argv[1].replace("_own.jsonl", "/run.json")))
recorded = run.get("recorded") or {}
print("perflab saw", recorded.get("steps_seen"), "steps; its own work at their boundaries (run.json's recorded.own_work):")
for w in recorded.get("own_work") or []:
    print(" ", w)
EOF
      done ;;
    floor)
      (cd benchmarks && python ab_floor_gpu.py --out "$OUT/ab_floor_gpu.json" --runs 2 --rounds 5 --parts truth eleven) 2>&1 | tail -40 ;;
    costs)
      python benchmarks/profiler_costs_gpu.py --out "$OUT/profiler_costs.json" 2>&1 | tail -30 ;;
    batch)
      : "${NANOGPT:?batch needs NANOGPT=/path/to/a nanoGPT checkout (github.com/karpathy/nanoGPT)}"
      R=$PWD
      (cd "$NANOGPT" && python -c "import sys; sys.path.insert(0, '$R/benchmarks'); from nanogpt_run import make_data; from pathlib import Path; make_data(Path('.'))" &&
       python -m perflab ab --skip 10 --steps 20 --input get_batch --a-args "--batch_size=8" --b-args "--batch_size=16" --out /tmp/ab_bs_input \
         --json -- train.py --dataset=synthetic --gradient_accumulation_steps=1 --max_iters=40 --eval_interval=1000000 --eval_iters=1 \
         --log_interval=1 --always_save_checkpoint=False --out_dir=/tmp/ngo --decay_lr=False --compile=False \
         > "$OUT/nanogpt_batch_ab.json" 2> "$OUT/nanogpt_batch_ab.err"); tail -3 "$OUT/nanogpt_batch_ab.err" ;;
    *) echo "unknown part $part (tests, clock, floor, costs, batch)" >&2; exit 2 ;;
  esac
done
find "$OUT" \( -name 'trace.json.gz' -o -name 'shapes.json.gz' -o -name 'trace.json' -o -name 'shapes.json' \) -delete
