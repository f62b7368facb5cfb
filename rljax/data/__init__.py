"""rljax.data: datasets, generated verifiable tasks, prompt templates, batching.

- records/loaders/specs: ``Example``, ``FieldMap``, JSONL/Parquet loading with
  located errors, built-in field maps (``load_dataset("gsm8k", path)``).
- arithmetic/countdown: procedurally generated tasks with exact answers.
- prompts: boxed, R1-Zero and chat templates; prompt-length filtering.
- iteration: seeded, resumable batch iterator.
"""

from rljax.data.arithmetic import (
  ARITHMETIC_LEVELS,
  ArithmeticConfig,
  generate_arithmetic,
  parse_difficulty,
)
from rljax.data.countdown import (
  COUNTDOWN_LEVELS,
  CountdownConfig,
  generate_countdown,
  solve_countdown,
)
from rljax.data.iteration import BatchIterator, epoch_permutation, shuffled
from rljax.data.loaders import (
  from_records,
  load_file,
  load_hf,
  load_jsonl,
  load_parquet,
)
from rljax.data.prompts import (
  BOXED_INSTRUCTION,
  BoxedTemplate,
  ChatTemplate,
  R1ZeroTemplate,
  count_prompt_tokens,
  filter_by_prompt_length,
  render_prompts,
)
from rljax.data.records import (
  Compose,
  DataError,
  Example,
  FieldMap,
  LoadedDataset,
  LoadStats,
)
from rljax.data.specs import DATASET_SPECS, load_dataset

__all__ = [
  "ARITHMETIC_LEVELS",
  "ArithmeticConfig",
  "parse_difficulty",
  "BOXED_INSTRUCTION",
  "BatchIterator",
  "BoxedTemplate",
  "COUNTDOWN_LEVELS",
  "Compose",
  "ChatTemplate",
  "CountdownConfig",
  "DATASET_SPECS",
  "DataError",
  "Example",
  "FieldMap",
  "LoadStats",
  "LoadedDataset",
  "R1ZeroTemplate",
  "count_prompt_tokens",
  "epoch_permutation",
  "filter_by_prompt_length",
  "from_records",
  "generate_arithmetic",
  "generate_countdown",
  "load_dataset",
  "load_file",
  "load_hf",
  "load_jsonl",
  "load_parquet",
  "render_prompts",
  "shuffled",
  "solve_countdown",
]
