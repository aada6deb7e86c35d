#!/usr/bin/env bash
# perflab run's explanation against independent measures, one GPU (docs/performance/run.md):
#   nanoGPT's train.py at 4 and 40 micro-steps under perflab run; the same configuration in a plain loop traced CUDA-only
#   (benchmarks/nanogpt_busy.py); the eager NVTX decode loop, with this perflab and with the one before (OLD_SRC, if set).
# usage: NANOGPT=/path/to/nanoGPT OUT=dir [OLD_SRC=/path/to/old/src] bash benchmarks/run_explain_gpu.sh
set -u
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
EXTRA=${PYTHONPATH#src}
mkdir -p "$OUT"
nvidia-smi -L
python benchmarks/nanogpt_run.py --nanogpt "$NANOGPT" --gas 4 --out "$OUT/nanogpt_gas4.json" 2>&1 | tail -60
test -n "${SKIP_BUSY:-}" || python benchmarks/nanogpt_busy.py --nanogpt "$NANOGPT" --gas 4 --out "$OUT/busy_gas4.json"
python benchmarks/nanogpt_run.py --nanogpt "$NANOGPT" --gas 40 --skip 5 --steps 12 --iters 25 --out "$OUT/nanogpt_gas40.json" 2>&1 | tail -40
test -n "${SKIP_BUSY:-}" || python benchmarks/nanogpt_busy.py --nanogpt "$NANOGPT" --gas 40 --warmup 4 --steps 6 --traced 3 --out "$OUT/busy_gas40.json"
python -m perflab run --step-range BENCHMARK --skip 0 --steps 40 --trace 3 --out "$OUT/decode" -- python benchmarks/programs/decode_nvtx.py --decode 2>&1 | tail -25
if [ -n "${OLD_SRC:-}" ]; then
  PYTHONPATH="$OLD_SRC$EXTRA" python -m perflab run --step-range BENCHMARK --skip 0 --steps 40 --trace 3 --out "$OUT/decode_old" -- python benchmarks/programs/decode_nvtx.py --decode 2>&1 | grep -i "verdict\|MBU\|median"
fi
# what comes back: the JSON reports (the traces stay behind)
find "$OUT" -name 'trace.json.gz' -delete
