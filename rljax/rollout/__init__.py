"""rljax.rollout: rollout engines behind one interface (`base.RolloutEngine`).

`JaxSampler` runs the rljax decoder in jit (f32 / bf16 / int8 / fp8 weights);
the vLLM sidecar lives in its own modules and is imported on demand, so that
this package imports without vLLM installed.
"""

from rljax.rollout.base import FINISH_REASONS
from rljax.rollout.base import RolloutBatch
from rljax.rollout.base import RolloutEngine
from rljax.rollout.base import SamplingConfig
from rljax.rollout.base import SyncStats
from rljax.rollout.base import check_prompts
from rljax.rollout.jax_sampler import JaxSampler
from rljax.rollout.jax_sampler import QUANT_MODES
from rljax.rollout.jax_sampler import sample_next_token

__all__ = [
  "FINISH_REASONS",
  "RolloutBatch",
  "RolloutEngine",
  "SamplingConfig",
  "SyncStats",
  "check_prompts",
  "JaxSampler",
  "QUANT_MODES",
  "sample_next_token",
]
