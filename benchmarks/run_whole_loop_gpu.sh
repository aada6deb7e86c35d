#!/usr/bin/env bash
# perflab run on programs it was not written for, each against its own clock and NVML (docs/performance/run.md):
#   an ImageNet-style trainer whose 4 loader workers are slower than the GPU, the same with 12 workers, the same started
#   with torch.multiprocessing.spawn, both trainers under TraceML too, transformers' Trainer on a GPT-2, a compiled GPT-2
#   loop that reads its loss every step (and without), the eager NVTX decode loop, and what the watch costs.
# usage: OUT=dir [TRACEML=1] [ONLY="slow ample ..."] bash benchmarks/run_whole_loop_gpu.sh
# Every program logs its own per-step clock beside perflab's run.json; benchmarks/whole_loop_table.py makes the tables.
set -u
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
P=benchmarks/programs
ONLY=${ONLY:-"cost slow ample spawn trainer nonan sync nosync decode traceml"}
want() { case " $ONLY " in *" $1 "*) return 0;; esac; return 1; }
run() {  # run NAME PERFLAB-OPTIONS -- PROGRAM ARGS: perflab run into $OUT/NAME, its console into $OUT/NAME.log
  local name=$1; shift
  echo "=== $name" >&2
  local t0=$SECONDS
  python -m perflab run --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: $((SECONDS - t0)) s" >&2
  grep -E "^(verdict|stalls|perflab:)" -A3 "$OUT/$name.log" | head -20
}
nvidia-smi -L
want cost && python benchmarks/loop_watch_cost.py --calls 20000 --out "$OUT/cost.json" | tail -3
IMG="$P/imagenet_synthetic.py --steps 70 --print-freq 10"
want slow && run slow --skip 10 --steps 40 --trace 3 -- $IMG -a resnet18 -b 256 -j 4 --decode-ms 2 --log "$OUT/slow_own.jsonl"
want ample && run ample --skip 10 --steps 40 --trace 3 -- $IMG -a resnet50 -b 128 -j 12 --decode-ms 1 --log "$OUT/ample_own.jsonl"
want spawn && run spawn --skip 10 --steps 40 --trace 3 -- $IMG -a resnet50 -b 128 -j 12 --decode-ms 1 --spawn --log "$OUT/spawn_own.jsonl"
want trainer && run trainer --skip 10 --steps 40 --trace 3 -- $P/hf_trainer_gpt2.py --steps 70 --batch-size 8 --seq-len 1024 --log "$OUT/trainer_own.jsonl"
want nonan && run nonan --skip 10 --steps 40 --trace 3 -- $P/hf_trainer_gpt2.py --steps 70 --batch-size 8 --seq-len 1024 --no-nan-filter --log "$OUT/nonan_own.jsonl"
want sync && run sync --skip 30 --steps 200 --trace 3 -- $P/compiled_gpt_sync.py --steps 260 --log "$OUT/sync_own.jsonl"
want nosync && run nosync --skip 30 --steps 200 --trace 3 -- $P/compiled_gpt_sync.py --steps 260 --no-sync --log "$OUT/nosync_own.jsonl"
want decode && run decode --step-range BENCHMARK --skip 0 --steps 40 --trace 3 -- python $P/decode_nvtx.py --decode
traceml() { python -c "import sys; from traceml_ai.launcher.cli import main; sys.exit(main())" "$@"; }  # its console script, wherever pip put it
if want traceml && [ -n "${TRACEML:-}" ]; then
  for cfg in "slow -a resnet18 -b 256 -j 4 --decode-ms 2" "ample -a resnet50 -b 128 -j 12 --decode-ms 1"; do
    set -- $cfg; name=$1; shift
    echo "=== traceml_$name" >&2
    traceml run $P/imagenet_synthetic.py --logs-dir "$OUT/traceml" --run-name "$name" --args --steps 70 --print-freq 10 "$@" --traceml \
      --log "$OUT/traceml_${name}_own.jsonl" > "$OUT/traceml_$name.log" 2>&1
    grep -iE "verdict|why|step time|input wait" "$OUT/traceml_$name.log" | head -8
  done
fi
# what comes back: the reports and logs, not the traces
find "$OUT" \( -name 'trace.json.gz' -o -name 'shapes.json.gz' \) -delete
