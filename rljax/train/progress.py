"""The training run's progress bar: steps done, and the last step's reward,
response length and seconds, on the main process only."""

from __future__ import annotations

import contextlib
from typing import Iterator

from tqdm import tqdm

from rljax import distributed


class Bar:
  """A tqdm bar over a run's steps (a no-op when disabled)."""

  def __init__(self, bar: tqdm):
    self._bar = bar

  def step(self, row: dict[str, float]) -> None:
    """One more step done; `row` is its metrics row."""
    self._bar.set_postfix(
      reward=f"{row['reward_mean']:.3f}",
      len=f"{row['response_length_mean']:.0f}",
      s=f"{row['time_step']:.1f}",
    )
    self._bar.update(1)


@contextlib.contextmanager
def bar(total: int, initial: int, show: bool) -> Iterator[Bar]:
  """A bar from `initial` (a resumed run's step) to `total` steps, shown
  when `show` and this is the main process; closed on exit."""
  t = tqdm(
    total=total,
    initial=initial,
    desc="rl",
    disable=not (show and distributed.is_main_process()),
    dynamic_ncols=True,
  )
  try:
    yield Bar(t)
  finally:
    t.close()
