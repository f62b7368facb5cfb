"""Logits parity of every supported architecture with PyTorch transformers.

For each of Llama, Qwen2 and Qwen3 (tied and untied LM head) a small random
model is built in transformers (norm weights randomized too, so a missing
norm shows), saved as an HF dir, loaded by rljax, and both decode the same
left-padded prompts greedily. Prints max |Δ logit| over prompt and decode
steps and whether every greedy token matched.

  python experiments/parity_archs.py
"""

from __future__ import annotations

import tempfile

from absl import app, flags

from rljax import models
from rljax.models import hf_parity

_NEW = flags.DEFINE_integer("new_tokens", 12, "Greedy tokens per prompt.")
_SEED = flags.DEFINE_integer("seed", 0, "torch seed of the random weights.")

PROMPTS = [[5, 17, 99, 3, 64, 21, 8], [42, 7, 7, 120, 11], [9] * 12]

CONFIGS = {
  "llama (untied)": models.tiny_config(
    arch="llama", head_dim=16, tie_word_embeddings=False
  ),
  "llama (tied)": models.tiny_config(
    arch="llama", head_dim=16, tie_word_embeddings=True
  ),
  "qwen2 (untied)": models.tiny_config(
    arch="qwen2",
    head_dim=16,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
  ),
  "qwen3 (untied)": models.tiny_config(
    arch="qwen3",
    head_dim=16,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
  ),
  "qwen3 (tied)": models.tiny_config(
    arch="qwen3",
    head_dim=16,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
  ),
}


def random_hf_model(config, seed: int):
  """A transformers model of `config` with every weight (norms included)
  random."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  hf = config.to_hf()
  arch = hf.pop("architectures")[0]
  hf.pop("model_type")
  config_cls = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
  }[arch]
  torch.manual_seed(seed)
  model = getattr(transformers, arch)(config_cls(**hf)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


def main(argv):
  del argv
  print(f"{'architecture':<16} {'max |Δlogit|':>13} {'greedy match':>13}")
  for name, config in CONFIGS.items():
    hf_model = random_hf_model(config, _SEED.value)
    with tempfile.TemporaryDirectory() as d:
      hf_model.save_pretrained(d)
      loaded, params = models.load_hf(d)
    report = hf_parity.compare_with_transformers(
      loaded, params, hf_model, PROMPTS, _NEW.value
    )
    print(
      f"{name:<16} {report['max_abs_dlogit']:>13.2e} "
      f"{str(report['all_greedy_match']):>13}",
      flush=True,
    )


if __name__ == "__main__":
  app.run(main)
