"""Prompt templates and prompt-length filtering.

A template is a callable ``question -> prompt text``:
- ``BoxedTemplate``: the question plus "put your final answer within \\boxed{}".
- ``R1ZeroTemplate``: the DeepSeek-R1-Zero conversation template (DeepSeek-AI
  2025, table 1) for base models; the prompt ends in ``<think>``, so the
  completion starts inside the reasoning block (``rewards.r1_format_reward``
  knows). The table's "." after the question is left out: questions end in
  their own punctuation.
- ``ChatTemplate``: an instruct model's own chat format through its
  tokenizer's ``apply_chat_template``, wrapping another template's text as the
  user turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

from rljax.data.records import Example

__all__ = [
  "BOXED_INSTRUCTION",
  "BoxedTemplate",
  "ChatTemplate",
  "PromptTemplate",
  "R1ZeroTemplate",
  "count_prompt_tokens",
  "filter_by_prompt_length",
  "render_prompts",
]

BOXED_INSTRUCTION = (
  "Please reason step by step, and put your final answer within \\boxed{}."
)

_R1_ZERO = (
  "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
  "The assistant first thinks about the reasoning process in the mind and then provides the user with "
  "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
  "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
  "</answer>. User: {question} Assistant: <think>"
)


class PromptTemplate(Protocol):
  def __call__(self, question: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class BoxedTemplate:
  """``question`` + newline + ``instruction``."""

  instruction: str = BOXED_INSTRUCTION

  def __call__(self, question: str) -> str:
    return f"{question}\n{self.instruction}" if self.instruction else question


@dataclasses.dataclass(frozen=True)
class R1ZeroTemplate:
  """The R1-Zero template; ``template`` must contain ``{question}``."""

  template: str = _R1_ZERO

  def __post_init__(self):
    if "{question}" not in self.template:
      raise ValueError(
        "R1ZeroTemplate.template has no '{question}' placeholder"
      )

  def __call__(self, question: str) -> str:
    return self.template.replace("{question}", question.strip())


class ChatTemplate:
  """The tokenizer's chat format around ``user_template(question)``.

  Args:
    tokenizer: any object with Hugging Face's ``apply_chat_template``.
    user_template: builds the user message (default: ``BoxedTemplate()``).
    system: an optional system message.
  """

  def __init__(
    self,
    tokenizer: Any,
    *,
    user_template: Callable[[str], str] = BoxedTemplate(),
    system: str | None = None,
  ):
    if not callable(getattr(tokenizer, "apply_chat_template", None)):
      raise TypeError(
        f"ChatTemplate: tokenizer {type(tokenizer).__name__} has no apply_chat_template"
      )
    self.tokenizer = tokenizer
    self.user_template = user_template
    self.system = system

  def __call__(self, question: str) -> str:
    messages = (
      []
      if self.system is None
      else [{"role": "system", "content": self.system}]
    )
    messages.append({"role": "user", "content": self.user_template(question)})
    text = self.tokenizer.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str):
      raise TypeError(
        f"ChatTemplate: apply_chat_template returned {type(text).__name__}, expected str"
      )
    return text


def render_prompts(
  examples: Sequence[Example], template: Callable[[str], str]
) -> list[str]:
  """The prompt text of each example."""
  return [template(example.question) for example in examples]


def count_prompt_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
  """Token counts, without adding special tokens (a chat-formatted prompt
  already has them). ``tokenizer``: a Hugging Face tokenizer (batched call)
  or any object with ``encode(text) -> list``."""
  if not texts:
    return []
  if callable(tokenizer) and hasattr(tokenizer, "apply_chat_template"):
    return [
      len(ids)
      for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    ]
  encode = getattr(tokenizer, "encode", None)
  if not callable(encode):
    raise TypeError(
      f"count_prompt_tokens: tokenizer {type(tokenizer).__name__} has no encode()"
    )
  return [len(encode(text)) for text in texts]


def filter_by_prompt_length(
  examples: Sequence[Example],
  template: Callable[[str], str],
  tokenizer: Any,
  max_tokens: int,
) -> tuple[list[Example], int]:
  """(examples whose templated prompt has <= ``max_tokens`` tokens, number dropped)."""
  if (
    isinstance(max_tokens, bool)
    or not isinstance(max_tokens, int)
    or max_tokens < 1
  ):
    raise ValueError(
      f"filter_by_prompt_length: max_tokens is {max_tokens!r}; expected an int >= 1"
    )
  counts = count_prompt_tokens(tokenizer, render_prompts(examples, template))
  kept = [
    example for example, count in zip(examples, counts) if count <= max_tokens
  ]
  return kept, len(examples) - len(kept)
