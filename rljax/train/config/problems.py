"""A config problem and the error that lists them: the one shape in which
every check of a TrainConfig reports (the field, its value, what was
expected), worded by core (`rljax.core._validation`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from rljax.core import _validation as v


@dataclasses.dataclass(frozen=True)
class Problem:
  """One bad setting: the field (its flag), its value, what was expected."""

  field: str
  value: Any
  expected: str

  def __str__(self) -> str:
    return v.field_message(f"--{self.field}", self.value, self.expected)


class ConfigError(ValueError):
  """Every problem of a config, one per line."""

  def __init__(self, problems: Sequence[Problem]):
    self.problems = tuple(problems)
    n = len(self.problems)
    super().__init__(
      f"{n} problem{'s' if n > 1 else ''} in the training config:\n"
      + "\n".join(f"  {p}" for p in self.problems)
    )
