"""The pieces of experiments/bench_async.py, one concern a module.

Lowest first; a module imports only those before it:
  pinning  the vLLM sidecar's processes on one core, the trainer's threads
           on the others (--engine_core);
  summary  one mode's summary from its metrics rows: wall per step,
           steps/hour, idle fractions, the version-lag distribution,
           untrained tokens; the steps/hour ratios against their targets;
  report   the printout and the plot of a whole run.

experiments/bench_async.py (flags, the modes, one Trainer per mode, main)
runs with experiments/ on sys.path and imports them as
`bench_async_lib.<module>`. None defines flags, so they import anywhere.
"""
