"""The pieces of experiments/bench_rollout.py, one concern a module.

Lowest first; a module imports only those before it:
  flag_checks  every flag of the script, checked before anything runs (all
               problems at once, `error: ...` and exit status 2);
  rows         the fixed-shape workload (prompts, PxNxT shapes) and the row
               every engine's measurement becomes;
  mismatch     KL of an engine's samples to the full-precision policy
               (exact from logits, or the k1 estimate);
  jax_engine   the JAX sampler's rows: a timed rollout per weight format,
               its sync, CPU time, KL, an optional profile;
  vllm_engine  the vLLM sidecar's rows: an exported checkpoint, the timed
               weight syncs, a timed rollout, the sidecar's CPU time;
  runner       the rows of one shape, engine after engine, each saved as
               soon as it is measured;
  report       the Markdown tables, ratios against targets, and the plot;
  decode_ab    --decode_ab: the repeated against the shared-prefix decode
               step.

experiments/bench_rollout.py (flags and main) runs with experiments/ on
sys.path and imports them as `bench_rollout_lib.<module>`; the RL-shaped
--workloads rows are experiments/bench_workloads.py's.
"""
