#!/usr/bin/env bash
# The second half of benchmarks/run_whole_loop_gpu.sh's runs (one device call each half): the compiled GPT-2 loop with
# and without its per-step synchronisation, transformers' Trainer without its nan filter (the synchronisation the
# first half named), the eager NVTX decode loop, and nanoGPT's train.py at 4 micro-steps beside a CUDA-only trace of
# its model in a plain loop. usage: OUT=dir NANOGPT=/path/to/nanoGPT [ONLY=...] bash benchmarks/run_whole_loop_gpu2.sh
set -u
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
ONLY=${ONLY:-"nonan sync nosync decode"} bash benchmarks/run_whole_loop_gpu.sh
if [ -n "${NANOGPT:-}" ]; then
  for gas in ${GAS:-4}; do
    echo "=== nanogpt gas $gas" >&2
    iters=55; skip=15; steps=30; busy="--gas $gas"
    if [ "$gas" -ge 20 ]; then iters=25; skip=5; steps=12; busy="--gas $gas --warmup 4 --steps 6 --traced 3"; fi
    python benchmarks/nanogpt_run.py --nanogpt "$NANOGPT" --gas "$gas" --skip $skip --steps $steps --iters $iters --input get_batch \
      --out "$OUT/nanogpt_gas$gas.json" 2>&1 | grep -E "perflab_step_ms|nanogpt_iter|mean_ms|ratio|verdict\"|kernel_fill|busy_share|message" | head -12
    python benchmarks/nanogpt_busy.py --nanogpt "$NANOGPT" $busy --out "$OUT/busy_gas$gas.json" 2>&1 | tail -3
  done
  find "$OUT" \( -name 'trace.json.gz' -o -name 'shapes.json.gz' \) -delete
fi
