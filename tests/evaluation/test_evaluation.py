"""The evaluation harness: dataset specs, per-sample records, pass@k."""

import jax
import numpy as np
import pytest

from rljax import data as data_lib
from rljax import evaluation
from rljax import models
from rljax.rollout.base import RolloutBatch, SamplingConfig


class TestParseDatasets:
  def test_name_path_limit(self):
    specs = evaluation.parse_datasets("gsm8k:a/b.jsonl:10,arithmetic:easy")
    assert specs == [
      evaluation.EvalSpec("gsm8k", "a/b.jsonl", 10),
      evaluation.EvalSpec("arithmetic", "easy", 0),
    ]

  def test_empty_is_an_error(self):
    with pytest.raises(ValueError, match="no dataset"):
      evaluation.parse_datasets(" , ")

  def test_dataset_without_path_is_named(self):
    with pytest.raises(ValueError, match="gsm8k"):
      evaluation.load_examples(evaluation.EvalSpec("gsm8k"))


class ScriptedEngine:
  """Answers with fixed completions: a stand-in for a rollout engine that
  lets the scoring arithmetic be checked by hand."""

  def __init__(self, tokenizer, texts):
    self.tokenizer, self.texts = tokenizer, texts

  def generate(self, prompt_ids, sampling):
    ids = [
      self.tokenizer.encode(t, add_special_tokens=False) for t in self.texts
    ]
    return RolloutBatch(
      prompt_ids=list(prompt_ids),
      response_ids=ids,
      behav_logp=[np.zeros(len(i), np.float32) for i in ids],
      finish_reason=["stop"] * len(ids),
      n=sampling.n,
    )


def test_avg_and_pass_at_k_are_counted_per_problem():
  tok = models.load_tokenizer(models.default_gguf_path())
  model = models.Model(config=None, params=None, tokenizer=tok)
  examples = data_lib.generate_arithmetic(2, "easy", seed=0)
  a0, a1 = examples[0].answer, examples[1].answer
  # Problem 0: 1 of 2 samples right; problem 1: 0 of 2 in a strict format,
  # but its second sample ends on the right number without one.
  texts = [
    f"\\boxed{{{a0}}}",
    "\\boxed{-999}",
    "\\boxed{-999}",
    f"so it is {a1}",
  ]
  summary, records = evaluation.evaluate_dataset(
    model,
    ScriptedEngine(tok, texts),
    examples,
    SamplingConfig(n=2, temperature=1.0, max_new_tokens=8),
    k=2,
  )
  assert summary["avg@2"] == pytest.approx(0.25)
  assert summary["pass@2"] == pytest.approx(0.5)
  assert [r["correct"] for r in records] == [True, False, False, False]
  assert [r["correct_last_number"] for r in records] == [
    True,
    False,
    False,
    True,
  ]
  assert summary["avg@2_last_number"] == pytest.approx(0.5)
  assert {r["uid"] for r in records} == {examples[0].uid, examples[1].uid}


def test_jax_sampler_greedy_eval_runs_end_to_end():
  from rljax.rollout.jax_sampler import JaxSampler

  tok = models.load_tokenizer(models.default_gguf_path())
  config = models.tiny_config(vocab_size=len(tok))
  params = models.init_params(config, jax.random.PRNGKey(0))
  model = models.Model(config=config, params=params, tokenizer=tok)
  engine = JaxSampler(config, params, max_prompt_len=128, pad_id=0)
  examples = data_lib.generate_arithmetic(3, "easy", seed=1)
  summary, records = evaluation.evaluate_dataset(
    model,
    engine,
    examples,
    SamplingConfig(n=1, greedy=True, max_new_tokens=4),
    k=1,
  )
  assert summary["examples"] == 3 and len(records) == 3
  assert summary["truncated_fraction"] == pytest.approx(
    np.mean([r["finish_reason"] == "length" for r in records])
  )
  assert all(r["response_tokens"] <= 4 for r in records)


class TestDatasetLabels:
  def test_default_label_is_the_name(self):
    specs = evaluation.parse_datasets("gsm8k:g.jsonl,arithmetic:easy:5")
    assert [s.label for s in specs] == ["gsm8k", "arithmetic"]

  def test_explicit_labels(self):
    specs = evaluation.parse_datasets("a=math500:x/a.jsonl,b=math500:b.jsonl:3")
    assert specs == [
      evaluation.EvalSpec("math500", "x/a.jsonl", 0, "a"),
      evaluation.EvalSpec("math500", "b.jsonl", 3, "b"),
    ]

  def test_duplicate_labels_are_refused(self):
    with pytest.raises(ValueError, match="duplicate dataset labels: 'math500'"):
      evaluation.parse_datasets("math500:a.jsonl,math500:b.jsonl")
    with pytest.raises(ValueError, match="duplicate dataset labels: 'x'"):
      evaluation.parse_datasets("x=gsm8k:a.jsonl,x=math500:b.jsonl")

  def test_label_must_be_a_file_name(self):
    with pytest.raises(ValueError, match="label 'a/b'"):
      evaluation.parse_datasets("a/b=math500:a.jsonl")
