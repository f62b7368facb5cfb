"""vLLM sidecar engines, split by concern: `config`, `process` (launch,
guard, logs), `sync` (weight directories), `sidecar` (one server: HTTP
fan-out, weight sync, restart), `pool` (several servers).

Import from `rljax.rollout.vllm_sidecar`, which re-exports them.
"""
