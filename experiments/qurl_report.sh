#!/bin/bash
# Regenerates docs/qurl_results.md from the archived runs (docs/qurl/runs).
set -e
# A new study (e.g. runs/qurl_gpu_s44/qurl_gpu2/q6_acr_fair_calibrated) is
# archived first, which also records the GPU driver's machine line
# (qurl_report_lib/studies.archive_study):
#   PYTHONPATH=$PWD python3 experiments/qurl_report.py --ablation_dir='' \
#     --studies=NAME:runs/.../NAME --archive=docs/qurl/runs --out=/tmp/x.md
# then added below as NAME:docs/qurl/runs/NAME.
cd "$(dirname "$0")/.."
PYTHONPATH=$PWD python3 experiments/qurl_report.py --studies=q1_instrument:docs/qurl/runs/q1_instrument,q2_instrument_gpu:docs/qurl/runs/q2_instrument_gpu,q3_instrument:docs/qurl/runs/q3_instrument,q4_long_horizon_gpu:docs/qurl/runs/q4_long_horizon_gpu,q4_long_horizon:docs/qurl/runs/q4_long_horizon,q4_long_horizon_pooled:docs/qurl/runs/q4_long_horizon_gpu+docs/qurl/runs/q4_long_horizon,q5_instrument:docs/qurl/runs/q5_instrument,instrument_tuning:docs/qurl/runs/instrument_tuning,q1_instrument_v1:docs/qurl/runs/q1_instrument_v1,q2_instrument_v1:docs/qurl/runs/q2_instrument_v1,q4_long_horizon_v1:docs/qurl/runs/q4_long_horizon_v1,q6_acr_fair:docs/qurl/runs/q6_acr_fair,q6_acr_fair_calibrated:docs/qurl/runs/q6_acr_fair_calibrated,q7_uaq_long_horizon:docs/qurl/runs/q7_uaq_long_horizon,q3_lr_control:docs/qurl/runs/q3_lr_control,q8_staleness:docs/qurl/runs/q8_staleness --archive='' --instrument_record=docs/qurl/runs/instrument.json --bench=docs/qurl/bench_rollout.json --base_rates=docs/qurl/base_rate/smollm2_a.json,docs/qurl/base_rate/smollm2_b.json --reading=docs/qurl/reading.md --smooth=5 --out=docs/qurl_results.md
