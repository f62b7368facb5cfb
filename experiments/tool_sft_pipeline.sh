#!/usr/bin/env bash
# Tool use learned with tool_choice=auto: held-out accuracy with and without
# the tool before, after a tool-use SFT warm-up (experiments/tool_sft.py),
# and after GRPO with `auto` (experiments/tool_rl.py); then the second task,
# word problems that take a Python program, before and after its warm-up.
#
#   OUT=runs/tool_sft bash experiments/tool_sft_pipeline.sh
#
# Each stage is skipped when its output is there (summary.json, or the SFT
# model), and the GRPO run resumes from its last checkpoint, so after a
# kill the same command goes on where it stopped. Knobs: N (held-out
# problems, 64), STEPS (GRPO steps, 20), SFT_STEPS (32), WORD (1: run the
# word-problem stages).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/tool_sft}
N=${N:-64}
STEPS=${STEPS:-20}
SFT_STEPS=${SFT_STEPS:-32}
WORD=${WORD:-1}
PY=${PY:-python3}
mkdir -p "$OUT"

stage() {  # stage NAME DONE_FILE CMD...
  local name=$1 done_file=$2
  shift 2
  if [[ -e $done_file ]]; then
    echo "[$(date -u +%FT%TZ)] $name: done ($done_file)"
    return
  fi
  echo "[$(date -u +%FT%TZ)] $name: $*"
  "$@"
  echo "[$(date -u +%FT%TZ)] $name: finished"
}

# Arithmetic with the calculator, tags, no worked example, two turns.
A="$OUT/arith"
ARITH_EVAL=(--task=tool_arithmetic --tool=calculator --tool_format=tags
  --tool_prompt=plain --tool_choice=auto --max_turns=2 --turn_tokens=48
  --budget=128 --n="$N" --throughput_rows=0)
stage arith_eval_base "$A/eval_base/summary.json" \
  $PY experiments/tool_eval.py --model=smollm2-135m-instruct \
  "${ARITH_EVAL[@]}" --out_dir="$A/eval_base"
stage arith_sft "$A/sft/model/config.json" \
  $PY experiments/tool_sft.py --task=tool_arithmetic --tool=calculator \
  --steps="$SFT_STEPS" --out_dir="$A/sft"
stage arith_eval_sft "$A/eval_sft/summary.json" \
  $PY experiments/tool_eval.py --model="$A/sft/model" "${ARITH_EVAL[@]}" \
  --out_dir="$A/eval_sft"
stage arith_grpo "$A/grpo/summary.json" \
  $PY experiments/tool_rl.py --model.name="$A/sft/model" \
  --task.tool_choice=auto --task.tool_prompt=plain --run.steps="$STEPS" \
  --run.checkpoint_every=5 --run.run_dir="$A/grpo"
stage arith_eval_grpo "$A/eval_grpo/summary.json" \
  $PY experiments/tool_eval.py --model="$A/grpo" "${ARITH_EVAL[@]}" \
  --out_dir="$A/eval_grpo"

[[ $WORD == 1 ]] || exit 0
# Word problems with the sandboxed Python tool: a program, its output, the
# answer.
W="$OUT/word"
WORD_EVAL=(--task=tool_word_problems --tool=python --tool_format=tags
  --tool_prompt=plain --tool_choice=auto --max_turns=2 --turn_tokens=128
  --budget=224 --max_prompt_tokens=640 --n="$N" --throughput_rows=0)
stage word_eval_base "$W/eval_base/summary.json" \
  $PY experiments/tool_eval.py --model=smollm2-135m-instruct \
  "${WORD_EVAL[@]}" --out_dir="$W/eval_base"
stage word_sft "$W/sft/model/config.json" \
  $PY experiments/tool_sft.py --task=tool_word_problems --tool=python \
  --steps="$SFT_STEPS" --out_dir="$W/sft"
stage word_eval_sft "$W/eval_sft/summary.json" \
  $PY experiments/tool_eval.py --model="$W/sft/model" "${WORD_EVAL[@]}" \
  --out_dir="$W/eval_sft"
