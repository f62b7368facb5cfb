#!/usr/bin/env bash
# The JAX sampler on a lent GPU (device tool): a Qwen2.5-0.5B-shaped model
# (random weights), each variant one bench_rollout.py process, its rows in
# $OUT/rollout_<name>.json and its log in $OUT/<name>.log. With TRACE=1 each
# rollout is traced once more (rljax.tracing: the longest kernels, and the
# share of the rollout's window that some kernel ran).
#
# Usage, from the repo root on the GPU machine:
#   bash experiments/gpu/sampler_profile.sh <name>:<bench_rollout flags> ...
# e.g. (2026-11-26, H100: the quantized formats with float32 against
# bfloat16 float leaves, docs/performance.md):
#   bash experiments/gpu/sampler_profile.sh \
#     "f32leaves:--jax_quants=int8,fp8 --quant_float_leaves=float32" \
#     "auto:--jax_quants=bf16,int8,fp8"
# Extra XLA flags go in XLA_FLAGS as usual; SHAPES and KL_ROWS override the
# defaults below.
set -u
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
pip install -q --no-deps -e . >/dev/null 2>&1 || export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import jax, jaxlib; print('jax', jax.__version__, jaxlib.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
SHAPES=${SHAPES:-16x8x128,64x8x256}
KL_ROWS=${KL_ROWS:-16}
for spec in "$@"; do
  name=${spec%%:*}
  extra=${spec#*:}
  trace=()
  [[ ${TRACE:-1} == 1 ]] && trace=(--trace_dir="/tmp/trace_$name")
  echo "=== $name: $extra XLA_FLAGS=${XLA_FLAGS:-}" | tee -a "$OUT/summary.txt"
  # shellcheck disable=SC2086  # $extra is a list of flags
  timeout "${PER_RUN_S:-240}" python experiments/bench_rollout.py \
    --model=qwen2.5-0.5b --random_init --engines=jax --shapes="$SHAPES" \
    --kl_rows="$KL_ROWS" "${trace[@]}" --out="$OUT/rollout_$name.json" $extra \
    > "$OUT/$name.log" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep -E '^\| jax|trace .*busy|^- jax' "$OUT/$name.log" | tee -a "$OUT/summary.txt"
  grep -E 'trace [a-z0-9_]+ [0-9x]+ +[0-9.]+ ms' "$OUT/$name.log" >> "$OUT/summary.txt"
  grep -iE 'error|Traceback' "$OUT/$name.log" | head -5
done
