#!/bin/bash
# Regenerates docs/qurl_results.md from the archived runs (docs/qurl/runs).
#
#   experiments/qurl_report.sh                    # from the archive as it is
#   QURL_RUNS=/work/runs_qurl experiments/qurl_report.sh
#
# With QURL_RUNS set, the studies below that have an --out_dir there are
# archived first (small files only, metrics and per-problem records
# gzipped; partial runs too, marked so on the page), with the
# instrument.json they started from, and so are the mechanism replays
# (QURL_RUNS/replay/<name>/replay.json). A study run in parts (two
# processes with disjoint seeds) is archived part by part and pooled.
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
RUNS=docs/qurl/runs
# study part: the out_dir's name under QURL_RUNS and in the archive, then
# the instrument directory (under QURL_RUNS) its runs start from.
NEW_PARTS="q9_acr_long_a:inst_add3 q9_acr_long_b:inst_add3 \
q9_acr_long_calibration:inst_add3 q10_uaq_table4_a:inst_medium \
q10_uaq_table4_b:inst_medium q11_streaming_probe:inst_medium \
q12_streaming_chunk_probe:inst_medium"
if [ -n "$QURL_RUNS" ]; then
  for entry in $NEW_PARTS; do
    part=${entry%%:*}
    inst=${entry##*:}
    [ -d "$QURL_RUNS/$part" ] || continue
    python3 experiments/qurl_report.py --ablation_dir='' \
      --studies="$part:$QURL_RUNS/$part" --archive="$RUNS" \
      --out=/tmp/qurl_archive_$$.md > /dev/null
    cp "$QURL_RUNS/$inst/instrument.json" "$RUNS/$part/instrument.json"
    # The runs ran on this host: its CPU model and dot flags, beside them.
    python3 - "$RUNS/$part/ablation.json" << 'PY'
import json, os, sys
from rljax.quant import cpu
path = sys.argv[1]
setup = json.load(open(path))
if not setup.get("machine"):
  info = cpu.host_cpu()
  flags = [f for f in ("avx2", "avx512_vnni", "avx512_bf16", "amx_int8",
                       "amx_bf16") if info.has(f)]
  setup["machine"] = (f"{info.model}, {os.cpu_count()} cores (CPU; "
                      f"flags {' '.join(flags)}), shared with other jobs")
  json.dump(setup, open(path, "w"), indent=1)
PY
  done
  for replay in "$QURL_RUNS"/replay/*/replay.json; do
    [ -f "$replay" ] || continue
    name=$(basename "$(dirname "$replay")")
    mkdir -p "docs/qurl/replay/$name"
    cp "$replay" "docs/qurl/replay/$name/replay.json"
  done
fi
# A study of one or two archived parts (NAME:DIR or NAME:DIR+DIR).
study() {
  local name=$1 dirs=""
  shift
  for part in "$@"; do
    [ -d "$RUNS/$part" ] && dirs="$dirs${dirs:++}$RUNS/$part"
  done
  [ -n "$dirs" ] && echo "$name:$dirs"
  return 0
}
STUDIES=(
  q1_instrument:$RUNS/q1_instrument
  q2_instrument_gpu:$RUNS/q2_instrument_gpu
  q3_instrument:$RUNS/q3_instrument
  q4_long_horizon_gpu:$RUNS/q4_long_horizon_gpu
  q4_long_horizon:$RUNS/q4_long_horizon
  q4_long_horizon_pooled:$RUNS/q4_long_horizon_gpu+$RUNS/q4_long_horizon
  q5_instrument:$RUNS/q5_instrument
  instrument_tuning:$RUNS/instrument_tuning
  q1_instrument_v1:$RUNS/q1_instrument_v1
  q2_instrument_v1:$RUNS/q2_instrument_v1
  q4_long_horizon_v1:$RUNS/q4_long_horizon_v1
  q6_acr_fair:$RUNS/q6_acr_fair
  q6_acr_fair_calibrated:$RUNS/q6_acr_fair_calibrated
  q7_uaq_long_horizon:$RUNS/q7_uaq_long_horizon
  q3_lr_control:$RUNS/q3_lr_control
  q8_staleness:$RUNS/q8_staleness
  $(study q9_acr_long_calibration q9_acr_long_calibration)
  $(study q9_acr_long q9_acr_long_a q9_acr_long_b)
  $(study q10_uaq_table4 q10_uaq_table4_a q10_uaq_table4_b)
  $(study q11_streaming_probe q11_streaming_probe)
  $(study q12_streaming_chunk_probe q12_streaming_chunk_probe)
)
REPLAYS=$(ls docs/qurl/replay/*/replay.json 2> /dev/null | paste -sd, -)
python3 experiments/qurl_report.py \
  --studies="$(IFS=,; echo "${STUDIES[*]}")" --archive='' \
  --instrument_record=$RUNS/instrument.json \
  --bench=docs/qurl/bench_rollout.json \
  --base_rates=docs/qurl/base_rate/smollm2_a.json,docs/qurl/base_rate/smollm2_b.json \
  --replays="$REPLAYS" --reading=docs/qurl/reading.md --smooth=5 \
  --out=docs/qurl_results.md
