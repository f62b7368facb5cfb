"""The RL loop end to end on a tiny random model: every preset takes two
steps, a killed run resumes to the same next step, pipelined mode runs, and
NaNs stop a step with a debug dump."""

import json
import os

import jax
import numpy as np
import pytest

from rljax import data as data_lib
from rljax.train import build_batch as build_batch_lib
from rljax.train import guard
from rljax.train import loop as loop_lib
from rljax.train import testing
from rljax.train.config import ALGORITHMS, apply_preset
from rljax.train.metrics import read_metrics
from rljax.train.tasks import Task


class LetterTask(Task):
  """Reward = share of 'e' among the completion's characters: it varies
  across a random model's samples, so advantages and gradients are not 0."""

  def score(self, completions, examples, n):
    scores = np.array(
      [c.count("e") / max(len(c), 1) for c in completions], np.float32
    )
    return scores, {"e_share": scores}


def small_config(algorithm, run_dir, **kw):
  base = dict(
    model="tiny",
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=6,
    eval_size=0,
    reward_workers=0,
    run_dir=str(run_dir),
    checkpoint_every=1,
    tensorboard=False,
    learning_rate=1e-3,
    export_hf=False,
  )
  if algorithm in ("ppo", "vapo", "orz"):
    base.update(group_size=2)
  # VAPO's 50 value-pretraining steps: tests/train/test_critic_pretrain.py.
  base["critic.pretrain_steps"] = 0
  base.update(kw)
  return apply_preset(algorithm, **base)


def make_trainer(cfg, task_cls=None, model=None):
  tokenizer = testing.tiny_tokenizer()
  examples = data_lib.generate_arithmetic(64, "easy", seed=cfg.run.seed)
  task = (task_cls or LetterTask)(
    examples[8:],
    examples[:8],
    tokenizer,
    data_lib.ChatTemplate(tokenizer),
    cfg.rollout.prompts_per_step,
    cfg.run.seed,
    cfg.task.max_prompt_tokens,
    reward_workers=0,
  )
  return loop_lib.Trainer(cfg, model=model, task=task, show_progress=False)


# Two presets in the default tier (a group baseline, a critic); every
# other preset runs in the slow tier, which CI runs too.
_DEFAULT_TIER_PRESETS = ("grpo", "ppo")


@pytest.mark.parametrize(
  "algorithm",
  [
    a if a in _DEFAULT_TIER_PRESETS else pytest.param(a, marks=pytest.mark.slow)
    for a in ALGORITHMS
  ],
)
def test_every_preset_takes_two_finite_steps(tmp_path, algorithm):
  trainer = make_trainer(small_config(algorithm, tmp_path))
  before = jax.tree.map(np.asarray, trainer.state.params)
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
    assert r["applied"] == 1.0
    assert 0.0 <= r["clip_fraction"] <= 1.0
  logged = read_metrics(str(tmp_path))
  assert [r["step"] for r in logged] == [1, 2]
  if trainer.cfg.uses_critic:
    assert "value_loss" in rows[-1]
  if trainer.cfg.kl.coef > 0:
    assert "kl_to_ref" in rows[-1]
  if algorithm == "grpo":
    # The params change when the rewards vary.
    assert rows[0]["advantage_abs_max"] > 0  # the letter task's variance
    diff = max(
      float(np.max(np.abs(a - np.asarray(b))))
      for a, b in zip(
        jax.tree.leaves(before), jax.tree.leaves(trainer.state.params)
      )
    )
    assert diff > 0


def test_killed_run_resumes_to_the_same_next_step(tmp_path):
  full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
  full = make_trainer(small_config("grpo", full_dir, steps=4))
  try:
    full_rows = full.run()
  finally:
    full.close()
  # The same run, "killed" after step 3: its object is dropped mid-run.
  killed = make_trainer(small_config("grpo", killed_dir, steps=4))
  killed.actor.sync(killed.policy_params(), killed.step_num)
  for _ in range(3):
    killed.train_step()
  killed.close()
  del killed
  resumed = make_trainer(small_config("grpo", killed_dir, steps=4, resume=True))
  assert resumed.step_num == 3
  try:
    resumed_rows = resumed.run()
  finally:
    resumed.close()
  assert [r["step"] for r in resumed_rows] == [4]
  np.testing.assert_allclose(
    resumed_rows[0]["loss"], full_rows[3]["loss"], rtol=1e-6
  )
  np.testing.assert_allclose(
    resumed_rows[0]["reward_mean"], full_rows[3]["reward_mean"]
  )
  for a, b in zip(
    jax.tree.leaves(full.state.params), jax.tree.leaves(resumed.state.params)
  ):
    np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7
    )
  assert [r["step"] for r in read_metrics(str(killed_dir))] == [1, 2, 3, 4]
  # A run directory that holds a run is refused without --run.resume.
  with pytest.raises(FileExistsError, match="--run.resume"):
    make_trainer(small_config("grpo", full_dir, steps=4))


def test_nan_stops_the_step_and_dumps_the_batch(tmp_path, monkeypatch):
  trainer = make_trainer(small_config("grpo", tmp_path, steps=1))
  original = build_batch_lib.make_batch

  def poisoned(*args, **kwargs):
    batch, metrics = original(*args, **kwargs)
    batch["advantages"] = batch["advantages"] * np.nan
    return batch, metrics

  monkeypatch.setattr(build_batch_lib, "make_batch", poisoned)
  trainer.actor.sync(trainer.policy_params(), trainer.step_num)
  with pytest.raises(guard.NonFiniteError, match="loss"):
    trainer.train_step()
  trainer.close()
  dumped = os.path.join(str(tmp_path), "debug_step1", "metrics.json")
  with open(dumped) as f:
    assert not np.isfinite(json.load(f)["loss"])
  assert os.path.exists(os.path.join(str(tmp_path), "debug_step1", "batch.npz"))


class _NanTask(LetterTask):
  """LetterTask whose reward is NaN for the samples in `nan_at` (all:
  every sample)."""

  nan_at = (1,)

  def score(self, completions, examples, n):
    scores, comps = super().score(completions, examples, n)
    scores = scores.copy()
    scores[list(self.nan_at) if self.nan_at != "all" else slice(None)] = np.nan
    return scores, comps


def _nan_trainer(cfg, nan_at):
  return make_trainer(cfg, type("NanTask", (_NanTask,), {"nan_at": nan_at}))


def test_a_nan_reward_drops_its_group_counted_and_named(tmp_path, capsys):
  """A NaN reward does not turn its group's advantages (and the step) into
  NaN: the group is dropped, counted and named."""
  cfg = small_config("grpo", tmp_path, steps=1, rollout_quant="none")
  trainer = _nan_trainer(cfg, (1,))
  try:
    (row,) = trainer.run()
  finally:
    trainer.close()
  assert row["reward_nonfinite"] == 1.0
  assert row["valid_fraction"] == 0.5  # one of the two groups trained on
  assert np.isfinite(row["loss"]) and row["applied"] == 1.0
  assert np.isfinite(row["reward_mean"])
  assert "1 non-finite reward (sample 1: nan)" in capsys.readouterr().out


def test_a_step_whose_every_reward_is_nan_is_refused(tmp_path):
  cfg = small_config("grpo", tmp_path, steps=1, rollout_quant="none")
  trainer = _nan_trainer(cfg, "all")
  try:
    with pytest.raises(ValueError, match="every reward is NaN or inf"):
      trainer.run()
  finally:
    trainer.close()


def test_pipelined_resume_keeps_the_qurl_diagnostics_series(tmp_path):
  """After a pipelined resume the first sync's QuRL
  diagnostics compare θ against the θ the uninterrupted run synced last
  (saved with the checkpoint), so they equal the uninterrupted run's
  instead of reading 0 (θ against itself)."""
  kw = dict(steps=4, pipelined=True, rollout_quant="int8")
  full = make_trainer(small_config("grpo", tmp_path / "full", **kw))
  try:
    full_rows = full.run()
  finally:
    full.close()
  # Pipelined: each step trains on the rollout of the step before.
  assert [r["rollout_staleness"] for r in full_rows] == [0.0, 1.0, 1.0, 1.0]
  assert all(np.isfinite(r["loss"]) for r in full_rows)
  cut = make_trainer(
    small_config("grpo", tmp_path / "cut", **dict(kw, steps=2))
  )
  try:
    cut.run()
  finally:
    cut.close()
  resumed = make_trainer(
    small_config("grpo", tmp_path / "cut", **dict(kw, resume=True))
  )
  try:
    resumed_rows = resumed.run()
  finally:
    resumed.close()
  assert [r["step"] for r in resumed_rows] == [3, 4]
  keys = [
    "quant/quantized_change_fraction",
    "quant/update_to_quant_error",
    "quant/normalized_weight_update",
    "quant/normalized_kernel_update",
  ]
  assert full_rows[3]["quant/quantized_change_fraction"] > 0
  for got, want in zip(resumed_rows, full_rows[2:]):
    np.testing.assert_allclose(
      [got[k] for k in keys], [want[k] for k in keys], rtol=1e-5,
      err_msg=f"step {got['step']}",
    )  # fmt: skip


def test_allowed_optimizer_changes_apply_on_resume(tmp_path):
  """--run.allow_config_change=optim.b1,optim.b2,
  optim.weight_decay is recorded in config_changes.jsonl, and the resumed
  optimizer uses the new values (inject_hyperparams kept the old ones)."""
  import optax

  first = make_trainer(small_config("grpo", tmp_path, steps=1))
  try:
    first.run()
  finally:
    first.close()
  resumed = make_trainer(
    small_config(
      "grpo",
      tmp_path,
      steps=2,
      resume=True,
      **{"optim.b1": 0.5, "optim.b2": 0.9, "optim.weight_decay": 0.1},
      allow_config_change="optim.b1,optim.b2,optim.weight_decay",
    )
  )
  try:
    for name, value in (("b1", 0.5), ("b2", 0.9), ("weight_decay", 0.1)):
      got = optax.tree_utils.tree_get(
        resumed.state.opt_state,
        name,
        filtering=lambda _, v: isinstance(v, jax.Array),
      )
      np.testing.assert_allclose(float(got), value, rtol=1e-6, err_msg=name)
    (row,) = resumed.run()
  finally:
    resumed.close()
  assert row["step"] == 2 and np.isfinite(row["loss"])
  with open(os.path.join(str(tmp_path), "config_changes.jsonl")) as f:
    changes = json.loads(f.readline())["changes"]
  assert sorted(changes) == ["optim.b1", "optim.b2", "optim.weight_decay"]


def test_a_huge_question_is_dropped_without_being_tokenized():
  """A row far longer than any prompt that fits is dropped before
  tokenizing (a 50 MB line took ~13 GB to tokenize; recorded 2026-11-27,
  commit 5f0f3b3)."""
  from rljax.train import tasks as tasks_lib

  tokenizer = testing.tiny_tokenizer()
  encoded = []

  class Spy:
    def encode(self, text, **kw):
      encoded.append(len(text))
      return tokenizer.encode(text, **kw)

  limit = 64 * tasks_lib.MAX_CHARS_PER_TOKEN
  examples = [
    data_lib.Example("What is 2 + 3?", "5"),
    data_lib.Example("x" * (limit + 1), "1"),  # 64 tokens cannot hold it
  ]
  kept, dropped = tasks_lib.drop_long_prompts(
    examples, lambda q: q, Spy(), max_tokens=64
  )
  assert [e.answer for e in kept] == ["5"] and dropped == 1
  assert encoded == [len("What is 2 + 3?")]
