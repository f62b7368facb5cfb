"""--rollout.speculative: speculative decoding in the trainer's continuous
JAX engine. Off by default; refused where it would do nothing; in a run it
changes no metric a batch determines (synchronous and streaming), and the
steps report its figures, the summary sums them, and the earlier
responses it drafts from are kept in the run directory."""

import os

import pytest

from rljax import models
from rljax.rollout import factory
from rljax.rollout import spec_store
from rljax.train import config as config_lib
from rljax.train import spec_summary
from tests.train.test_streaming import CONTINUOUS, STREAM0, _run, _untimed
from tests.train.test_trainer import small_config

SPEC = {"rollout.speculative": "suffix"}


def test_default_is_off():
  assert config_lib.TrainConfig().rollout.speculative == "off"


@pytest.mark.parametrize(
  "values,match",
  [
    ({"rollout.speculative": "eagle"}, "--rollout.speculative"),
    (SPEC, "--rollout.speculative='suffix'.*batching='static'"),
    (
      {**SPEC, "rollout.engine": "vllm"},
      "--rollout.speculative='suffix'",
    ),
  ],
)
def test_bad_or_no_op_settings_are_refused(values, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.TrainConfig().replace(values)


def test_the_factory_hands_it_to_the_sampler_with_a_run_store(tmp_path):
  engine = factory.make_engine(
    "jax",
    models.tiny_config(),
    None,
    quant="none",
    max_prompt_len=16,
    max_new_tokens=8,
    pad_id=0,
    batching="continuous",
    speculative="suffix",
    run_dir=str(tmp_path),
  )
  assert engine.speculative.mode == "suffix"
  assert engine.draft_store.path == os.path.join(
    str(tmp_path), spec_store.RUN_FILE
  )
  off = factory.make_engine(
    "jax", models.tiny_config(), None, quant="none", max_prompt_len=16,
    max_new_tokens=8, pad_id=0, batching="continuous",
  )  # fmt: skip
  assert off.speculative is None and off.draft_store is None


def _same_untimed(got, want):
  """The rows' metrics a batch determines, less speculation's own (those
  both rows have: a streaming row has other schedule keys)."""
  assert [r["step"] for r in got] == [r["step"] for r in want]
  for g, w in zip(got, want):
    g, w = _untimed(g), _untimed(w)
    shared = sorted(k for k in set(g) & set(w) if not k.startswith("spec_"))
    for key in ("loss", "reward_mean", "grad_norm"):
      assert key in shared
    assert {k: g[k] for k in shared} == {k: w[k] for k in shared}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
  cfg = small_config(
    "grpo", tmp_path_factory.mktemp("plain"), steps=3, **CONTINUOUS
  )
  return _run(cfg)[1]


def test_a_synchronous_run_is_unchanged_and_reports(plain, tmp_path):
  cfg = small_config("grpo", tmp_path, steps=3, **CONTINUOUS, **SPEC)
  _, rows, _ = _run(cfg)
  _same_untimed(rows, plain)
  for row in rows:
    for key in ("spec_acceptance", "spec_verify_steps", "spec_plain_steps"):
      assert key in row, key
  summary = spec_summary.summary(rows)
  assert summary["steps"] == 3
  assert summary["verify_steps"] + summary["plain_steps"] > 0
  assert "speculation over 3 steps" in spec_summary.line(summary)
  # Every group's responses went to the run's store: a resume reads them.
  store = spec_store.PromptStore(
    path=os.path.join(tmp_path, "spec_drafts.jsonl")
  )
  assert len(store) > 0


def test_a_streaming_run_is_the_synchronous_one(plain, tmp_path):
  cfg = small_config("grpo", tmp_path, steps=3, **STREAM0, **SPEC)
  _, rows, _ = _run(cfg)
  _same_untimed(rows, plain)
  assert all("spec_acceptance" in r for r in rows)
