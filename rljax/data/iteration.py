"""Deterministic shuffled batches with a small, resumable position.

``BatchIterator`` walks epochs of a fixed item list; epoch e is shuffled by a
permutation derived only from (seed, e), so the position is three integers
(epoch, offset in epoch, seed) plus two sizes that must match on reload.
Saving ``state_dict()`` in a checkpoint and calling ``load_state_dict()`` on a
fresh iterator gives exactly the batch that would have come next.
"""

from __future__ import annotations

import random
from typing import Generic, Iterator, Mapping, Sequence, TypeVar

__all__ = ["BatchIterator", "epoch_permutation", "shuffled"]

T = TypeVar("T")


def epoch_permutation(num_items: int, seed: int, epoch: int) -> list[int]:
  """The order of epoch ``epoch``: a permutation of range(num_items).

  ``random.Random`` seeded with a string (hashed with SHA-512), so the order
  does not depend on PYTHONHASHSEED, the platform or the numpy version.
  """
  order = list(range(num_items))
  random.Random(f"rljax-shuffle:{seed}:{epoch}").shuffle(order)
  return order


def shuffled(items: Sequence[T], seed: int) -> list[T]:
  """``items`` in the seed's order (epoch 0 of ``BatchIterator``)."""
  return [items[i] for i in epoch_permutation(len(items), seed, 0)]


def _check_int(name: str, value: object, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ValueError(
      f"BatchIterator: {name} is {value!r}; expected an int >= {low}"
    )
  return value


class BatchIterator(Generic[T]):
  """Batches of ``items`` over epochs, reshuffled every epoch.

  Args:
    items: the dataset (any sequence; batches are lists of its elements).
    batch_size: items per batch.
    seed: shuffling seed.
    shuffle: False keeps the order (still epoch-based and resumable).
    drop_last: drop an epoch's final short batch (default) or yield it.
    num_epochs: stop after this many epochs; None never stops.

  A batch never spans two epochs.
  """

  def __init__(
    self,
    items: Sequence[T],
    batch_size: int,
    *,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = True,
    num_epochs: int | None = None,
  ):
    if len(items) == 0:
      raise ValueError("BatchIterator: items is empty")
    if isinstance(seed, bool) or not isinstance(seed, int):
      raise ValueError(f"BatchIterator: seed is {seed!r}; expected an int")
    self.items = items
    self.batch_size = _check_int("batch_size", batch_size, 1)
    self.seed = seed
    self.shuffle = shuffle
    self.drop_last = drop_last
    self.num_epochs = (
      None if num_epochs is None else _check_int("num_epochs", num_epochs, 1)
    )
    if drop_last and len(items) < batch_size:
      raise ValueError(
        f"BatchIterator: {len(items)} items is fewer than batch_size {batch_size} with drop_last=True; "
        "no batch would ever be produced"
      )
    self.epoch = 0
    self.offset = 0
    self._order: list[int] | None = None

  @property
  def batches_per_epoch(self) -> int:
    full, rest = divmod(len(self.items), self.batch_size)
    return full if self.drop_last or rest == 0 else full + 1

  def _epoch_order(self) -> list[int]:
    if self._order is None:
      if self.shuffle:
        self._order = epoch_permutation(len(self.items), self.seed, self.epoch)
      else:
        self._order = list(range(len(self.items)))
    return self._order

  def __iter__(self) -> Iterator[list[T]]:
    return self

  def __next__(self) -> list[T]:
    end = self.offset + self.batch_size
    if end > len(self.items) and (
      self.drop_last or self.offset >= len(self.items)
    ):
      self.epoch, self.offset, self._order = self.epoch + 1, 0, None
      end = self.batch_size
    if self.num_epochs is not None and self.epoch >= self.num_epochs:
      raise StopIteration
    order = self._epoch_order()
    batch = [self.items[i] for i in order[self.offset : end]]
    self.offset = min(end, len(self.items))
    return batch

  def state_dict(self) -> dict[str, int]:
    """The position: plain ints, JSON- and checkpoint-friendly."""
    return {
      "epoch": self.epoch,
      "offset": self.offset,
      "seed": self.seed,
      "num_items": len(self.items),
      "batch_size": self.batch_size,
    }

  def load_state_dict(self, state: Mapping[str, int]) -> None:
    """Resumes at ``state``; the dataset size and batch size must match."""
    missing = [
      k
      for k in ("epoch", "offset", "seed", "num_items", "batch_size")
      if k not in state
    ]
    if missing:
      raise ValueError(f"BatchIterator.load_state_dict: state lacks {missing}")
    for key, current in (
      ("num_items", len(self.items)),
      ("batch_size", self.batch_size),
    ):
      if int(state[key]) != current:
        raise ValueError(
          f"BatchIterator.load_state_dict: state has {key}={state[key]} but this iterator has {current}; "
          "resuming on different data would not give the same batches"
        )
    offset = int(state["offset"])
    if not 0 <= offset <= len(self.items):
      raise ValueError(
        f"BatchIterator.load_state_dict: offset {offset} outside 0..{len(self.items)}"
      )
    self.seed = int(state["seed"])
    self.epoch = _check_int("epoch", int(state["epoch"]), 0)
    self.offset = offset
    self._order = None
