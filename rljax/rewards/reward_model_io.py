"""A trained reward model on disk: `save_reward_model` writes an orbax
checkpoint and an HF `LlamaForSequenceClassification`-style export
(`score.weight`, `num_labels=1`, last-non-pad-token pooling) that
transformers loads; `load_reward_model` reads the orbax params back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.rewards.bradley_terry import init_reward_model

FORMAT = "rljax-bradley-terry-reward-model"


@dataclasses.dataclass(frozen=True)
class RewardModel:
  config: models.ModelConfig
  params: dict[str, Any]
  tokenizer: Any = None
  max_len: int = 512


def save_reward_model(
  out_dir: str | os.PathLike,
  config: models.ModelConfig,
  params: dict[str, Any],
  tokenizer=None,
  max_len: int = 512,
  metrics: dict[str, float] | None = None,
) -> str:
  """Writes out_dir/{reward_model.json, orbax/, hf/}.

  orbax/ holds the params tree as trained (float32); hf/ is a
  `LlamaForSequenceClassification`-style checkpoint: the backbone's
  `model.*` tensors, `score.weight` [1, D] (the head's kernel), `num_labels`
  1 and the pad token that HF's last-non-pad-token pooling needs; it has
  no bias (0 after `make_train_step`; recorded as head_bias in
  reward_model.json).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  out_dir = os.path.abspath(os.fspath(out_dir))
  os.makedirs(out_dir, exist_ok=True)
  bias = float(np.asarray(params["head"]["bias"])[0])
  orbax_dir = os.path.join(out_dir, "orbax")
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(orbax_dir, jax.device_get(params), force=True)
  checkpointer.wait_until_finished()
  hf_dir = os.path.join(out_dir, "hf")
  os.makedirs(hf_dir, exist_ok=True)
  state = models.to_hf_state_dict(config, params["backbone"])
  state.pop("lm_head.weight", None)  # a classifier has no LM head
  kernel = np.asarray(params["head"]["kernel"], np.float32)
  state["score.weight"] = np.ascontiguousarray(kernel.T)
  state = {
    k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in state.items()
  }
  safetensors.numpy.save_file(
    state, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"}
  )
  hf_config = config.to_hf()
  arch = hf_config["architectures"][0].replace(
    "ForCausalLM", "ForSequenceClassification"
  )
  pad = config.pad_token_id
  if pad is None and tokenizer is not None:
    pad = getattr(tokenizer, "pad_token_id", None)
  hf_config.update(
    architectures=[arch],
    num_labels=1,
    id2label={"0": "LABEL_0"},
    label2id={"LABEL_0": 0},
    torch_dtype="float32",
    pad_token_id=pad,
  )
  with open(os.path.join(hf_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(hf_dir)
  meta = {
    "format": FORMAT,
    "pooling": "last_token",
    "max_len": max_len,
    "head_bias": bias,
    "model_config": config.to_hf(),
    "metrics": dict(metrics or {}),
  }
  with open(os.path.join(out_dir, "reward_model.json"), "w") as f:
    json.dump(meta, f, indent=1)
  return out_dir


def load_reward_model(
  path: str | os.PathLike, with_tokenizer: bool = True
) -> RewardModel:
  """Reads a `save_reward_model` directory (its orbax params)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = os.path.abspath(os.fspath(path))
  meta_path = os.path.join(path, "reward_model.json")
  if not os.path.isfile(meta_path):
    raise FileNotFoundError(
      f"reward_model_path={path!r} has no reward_model.json; expected a "
      "directory written by experiments/train_reward_model.py"
    )
  with open(meta_path) as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(
      f"{meta_path}: format={meta.get('format')!r}; expected {FORMAT!r}"
    )
  config = models.ModelConfig.from_hf(meta["model_config"])
  key = jax.random.PRNGKey(0)
  target = jax.eval_shape(
    lambda: init_reward_model(config, models.init_params(config, key), key)
  )
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), target
  )
  params = ocp.StandardCheckpointer().restore(
    os.path.join(path, "orbax"), abstract
  )
  tokenizer = None
  hf_dir = os.path.join(path, "hf")
  if with_tokenizer and models.pretrained.has_tokenizer_files(hf_dir):
    tokenizer = models.load_tokenizer(hf_dir)
  return RewardModel(config, params, tokenizer, int(meta.get("max_len", 512)))
