"""Per-token policy versions: `RolloutBatch.policy_version`,
the actor's stamp, the version-lag metrics, their checkpointing, and
`--run.async_mode` with `--run.pipelined` as its alias."""

import numpy as np
import pytest

from rljax.rollout.base import RolloutBatch
from rljax.train import checkpoint
from rljax.train import config as config_lib
from rljax.train import staleness
from tests.train.test_trainer import make_trainer, small_config


def rollout(versions=None, n=2, action_mask=None):
  """Two prompts, n = 2: responses of 3, 2, 1 and 2 tokens."""
  lengths = (3, 2, 1, 2)[: 2 * n]
  return RolloutBatch(
    prompt_ids=[[1, 2], [3]],
    response_ids=[[5] * k for k in lengths],
    behav_logp=[np.full(k, -1.0, np.float32) for k in lengths],
    finish_reason=["stop"] * len(lengths),
    n=n,
    action_mask=action_mask,
    policy_version=versions,
  )


VERSIONS = [[3, 3, 2], [1, 5], [4], [0, 5]]


class TestVersionLagMetrics:
  def test_hand_computed(self):
    # current 5: lags [2, 2, 3], [4, 0]: mean 11/5, max 4, 4 of 5 tokens
    # with lag >= 1, 1 of 5 with lag >= 4.
    got = staleness.version_lag_metrics([[3, 3, 2], [1, 5]], 5)
    assert got == pytest.approx(
      {
        "version_lag_mean": 2.2,
        "version_lag_max": 4.0,
        "version_lag_ge1": 0.8,
        "version_lag_ge4": 0.2,
      }
    )

  def test_mask_counts_only_the_kept_tokens(self):
    # kept lags 2, 3 (row 0) and 0 (row 1).
    mask = [np.array([1, 0, 1], bool), np.array([0, 1], bool)]
    got = staleness.version_lag_metrics([[3, 3, 2], [1, 5]], 5, mask)
    assert got == pytest.approx(
      {
        "version_lag_mean": 5 / 3,
        "version_lag_max": 3.0,
        "version_lag_ge1": 2 / 3,
        "version_lag_ge4": 0.0,
      }
    )

  def test_no_token_counted_reads_zero(self):
    got = staleness.version_lag_metrics([[], [2]], 2, [[], [False]])
    assert got == dict.fromkeys(staleness.LAG_KEYS, 0.0)

  def test_a_version_from_the_future_is_refused(self):
    with pytest.raises(ValueError, match="a token of version 6 at current"):
      staleness.version_lag_metrics([[3, 6]], 5)

  def test_a_mask_of_another_length_is_refused(self):
    with pytest.raises(ValueError, match=r"mask\[0\] has 2 entries"):
      staleness.version_lag_metrics([[3, 3, 2]], 5, [[True, True]])
    with pytest.raises(ValueError, match="mask has 2 rows"):
      staleness.version_lag_metrics([[3]], 5, [[True], [True]])

  def test_rollout_lag_metrics_masks_filler_groups_and_observations(self):
    # valid: the second group is a dynamic-sampling filler; action_mask
    # drops the first token of row 0. Kept lags at current 5: [2, 3], [4, 0].
    masks = [np.array(m, bool) for m in ([0, 1, 1], [1, 1], [1], [1, 1])]
    rb = rollout(VERSIONS, action_mask=masks)
    valid = np.array([True, True, False, False])
    got = staleness.rollout_lag_metrics(rb, 5, valid)
    assert got["version_lag_mean"] == pytest.approx(9 / 4)
    assert got["version_lag_max"] == 4.0
    assert got["version_lag_ge1"] == pytest.approx(3 / 4)
    assert staleness.rollout_lag_metrics(rollout(), 5) == {}


class TestRolloutBatchVersions:
  def test_stored_as_int32_and_validated(self):
    rb = rollout(VERSIONS)
    assert all(v.dtype == np.int32 for v in rb.policy_version)
    with pytest.raises(ValueError, match=r"policy_version\[1\] has shape"):
      rollout([[3, 3, 2], [1], [4], [0, 5]])
    with pytest.raises(ValueError, match="4 entries|3 entries"):
      rollout(VERSIONS[:3])
    with pytest.raises(ValueError, match="non-negative int32"):
      rollout([[3, 3, 2], [1, -1], [4], [0, 5]])
    with pytest.raises(ValueError, match="non-negative int32"):
      rollout([[3, 3, 2], [1.5, 2.0], [4], [0, 5]])
    with pytest.raises(TypeError, match="per-response int arrays"):
      rollout(np.zeros(4, np.int32))

  def test_select_groups_and_concat_carry_them(self):
    rb = rollout(VERSIONS)
    picked = rb.select_groups([1, 0])
    assert [v.tolist() for v in picked.policy_version] == [
      [4],
      [0, 5],
      [3, 3, 2],
      [1, 5],
    ]
    both = RolloutBatch.concat([rb, picked])
    assert [v.tolist() for v in both.policy_version] == VERSIONS + [
      v.tolist() for v in picked.policy_version
    ]
    # A batch of unknown versions makes the whole concat unknown.
    assert RolloutBatch.concat([rb, rollout()]).policy_version is None

  def test_with_policy_version_stamps_every_token(self):
    stamped = rollout().with_policy_version(9)
    assert [v.tolist() for v in stamped.policy_version] == [
      [9, 9, 9],
      [9, 9],
      [9],
      [9, 9],
    ]

  def test_checkpointed_in_flight_rollout_keeps_its_versions(self, tmp_path):
    path = tmp_path / "aux.npz"
    arrays = checkpoint.rollout_to_arrays(rollout(VERSIONS), {}, prefix="p0_")
    np.savez(path, **arrays)
    with np.load(path) as aux:
      back, _ = checkpoint.rollout_from_arrays(dict(aux), prefix="p0_")
    assert [v.tolist() for v in back.policy_version] == VERSIONS
    plain = checkpoint.rollout_to_arrays(rollout(), {}, prefix="p0_")
    assert not any("policy_version" in k for k in plain)
    again, _ = checkpoint.rollout_from_arrays(plain, prefix="p0_")
    assert again.policy_version is None


class TestAsyncModeFlag:
  def resolve(self, *layers):
    return config_lib.resolve("grpo", *layers)

  def test_async_mode_and_its_alias_agree(self):
    for layer, want in (
      ({}, ("off", False)),
      ({"run.async_mode": "one_step"}, ("one_step", True)),
      ({"run.pipelined": True}, ("one_step", True)),
      ({"run.async_mode": "off", "run.pipelined": False}, ("off", False)),
    ):
      run = self.resolve(layer).run
      assert (run.async_mode, run.pipelined) == want, layer

  def test_the_later_layer_wins_whichever_spelling(self):
    # Script default pipelined, then the typed flag async_mode=off.
    run = self.resolve({"run.pipelined": True}, {"run.async_mode": "off"}).run
    assert (run.async_mode, run.pipelined) == ("off", False)
    cfg = self.resolve().replace(**{"run.pipelined": True})
    assert cfg.run.async_mode == "one_step"

  def test_conflicting_values_are_one_clear_error(self):
    with pytest.raises(config_lib.ConfigError) as e:
      self.resolve({"run.async_mode": "off", "run.pipelined": True})
    assert "--run.async_mode='off'; expected one_step with run.pipelined" in (
      str(e.value)
    )
    with pytest.raises(config_lib.ConfigError, match="alias"):
      config_lib.TrainConfig(run=config_lib.RunConfig(pipelined=True))

  def test_streaming_is_a_mode_of_its_own(self):
    # Not the alias's: pipelined stays False (tests/train/test_streaming.py
    # runs it and checks what it refuses).
    run = self.resolve(
      {"run.async_mode": "streaming", "rollout.batching": "continuous"}
    ).run
    assert (run.async_mode, run.pipelined) == ("streaming", False)
    with pytest.raises(config_lib.ConfigError) as e:
      self.resolve({"run.async_mode": "streaming", "run.pipelined": True})
    assert "--run.async_mode='streaming'" in str(e.value)
    with pytest.raises(config_lib.ConfigError, match="one of"):
      self.resolve({"run.async_mode": "fast"})

  def test_a_config_json_older_than_the_field_reads_back(self):
    saved = self.resolve({"run.pipelined": True}).to_dict()
    del saved["run"]["async_mode"]
    assert config_lib.from_dict(saved).run.async_mode == "one_step"

  def test_staleness_needs_one_step(self):
    with pytest.raises(config_lib.ConfigError, match="async_mode=one_step"):
      self.resolve({"run.max_staleness": 2})
    run = self.resolve({"run.async_mode": "one_step", "run.max_staleness": 2})
    assert run.run.max_staleness == 2


def _run(cfg):
  trainer = make_trainer(cfg)
  try:
    return trainer, trainer.run()
  finally:
    trainer.close()


def test_the_trainer_logs_each_tokens_lag(tmp_path):
  """Synchronous: lag 0. One-step pipelined: 0 on the first step (θ_0's
  rollout for θ_0), then 1 on every token; a resume trains the saved
  in-flight rollout with its versions, so the resumed step reads lag 1
  too (without them its row would lack the metrics)."""
  _, sync_rows = _run(small_config("grpo", tmp_path / "sync", steps=2))
  for row in sync_rows:
    assert row["version_lag_mean"] == 0.0 and row["version_lag_max"] == 0.0
  kw = {"run.async_mode": "one_step"}
  trainer, pipe = _run(small_config("grpo", tmp_path / "p", steps=2, **kw))
  assert trainer.cfg.run.pipelined
  assert [r["version_lag_mean"] for r in pipe] == [0.0, 1.0]
  assert [r["version_lag_ge1"] for r in pipe] == [0.0, 1.0]
  assert [r["version_lag_ge4"] for r in pipe] == [0.0, 0.0]
  trainer, resumed = _run(
    small_config("grpo", tmp_path / "p", steps=3, resume=True, **kw)
  )
  assert [r["step"] for r in resumed] == [3]
  assert resumed[0]["version_lag_mean"] == 1.0
  assert resumed[0]["version_lag_max"] == 1.0
  # The actor stamps what it last pushed.
  trainer = make_trainer(small_config("grpo", tmp_path / "stamp", steps=1))
  try:
    trainer.actor.sync(trainer.policy_params(), 5)
    rb = trainer.actor.generate([[1, 2, 3]], trainer.collector._sampling(1, 0))
  finally:
    trainer.close()
  assert all((v == 5).all() for v in rb.policy_version)
  assert sum(len(v) for v in rb.policy_version) > 0
