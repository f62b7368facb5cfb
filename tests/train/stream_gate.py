"""A deterministic schedule for streaming mode's worker, for tests that
compare two streaming runs token for token.

Where a free-running worker takes new weights and new prompts depends on
how its thread and the trainer's meet; two runs differ wherever an
in-flight swap landed at another decode chunk. `GatedStream` is the real
`GroupStream` with the worker's two views of the trainer made a function
of the worker's own progress, counted in polls (one per slot-run loop:
a prefill or a decode chunk):

  prompts  request j (the paced round 0, in admission order) reaches the
           engine at a poll where nothing released is waiting and either
           nothing is in flight or `every` polls passed since the last
           release, and only once every group of request j − 1 − k (the
           one the trainer needs before it admits j) has ended; the worker
           waits there for request j's admission when it has not come yet
  weights  the worker sees the θ that was newest when request j was
           admitted (θ_{j−1−k}) from request j's release on, so a swap,
           or a checkpoint's cut, lands where the schedule says

So requests still in flight take θ mid-response (the swap a free-running
worker makes), and a checkpoint's cut hands rows back mid-response, at the
same polls in every run. Prompts a cut handed back, or a resume restored,
were released already: they go to the engine at the next poll, and the
poll count restarts from the cut. Used by `fault_worker.py`
(`RLJAX_TEST_STREAM_GATE`) and in-process.
"""

from __future__ import annotations

from rljax.train import group_stream


class GatedStream(group_stream.GroupStream):
  """`GroupStream` on the schedule above (`every` polls between two
  releases while rows are in flight)."""

  every = 1

  def __init__(self, actor, mailbox, *args, **kwargs):
    super().__init__(actor, mailbox, *args, **kwargs)
    self._history = {}  # version -> the published item
    self._admitted_at = {}  # request key -> newest version at admission
    self._next_step = 1  # the next paced request to release
    self._released = set()
    self._revealed = None
    self._polls = 0
    # step -> the poll from which its release waits only for `every`
    self._ready_since = {}
    publish = mailbox.publish

    def recording_publish(version, rparams, diag):
      publish(version, rparams, diag)
      with self._cv:
        self._history[int(version)] = mailbox.latest()
        self._cv.notify_all()

    mailbox.publish = recording_publish
    latest = mailbox.latest()
    if latest is not None:
      self._history[latest.version] = latest

  def admit(self, step, examples, prompts, seed, data_state, round_=0):
    if round_:
      raise NotImplementedError("GatedStream: refill requests")
    super().admit(step, examples, prompts, seed, data_state, round_)
    with self._cv:
      self._admitted_at[(int(step), 0)] = self.mailbox.latest().version
      self._cv.notify_all()

  def restore(self, saved, draw):
    super().restore(saved, draw)
    with self._cv:
      self._released.update(self._blocks)  # in flight before the cut
      self._next_step = self.admitted_through + 1

  def handback(self, prompts):
    super().handback(prompts)
    with self._cv:
      self._ready_since.clear()  # polls count from the cut

  def _newest(self):
    latest = self.mailbox.latest()
    if self._revealed is None:
      if latest is None:
        return None
      self._revealed = latest.version
      self._history.setdefault(latest.version, latest)
    return self._history[self._revealed]

  def _needed_done(self, step: int) -> bool:
    """Every group of the request the trainer trains before it admits
    request `step` has ended (or that request is gone: trained)."""
    block = self._blocks.get((step - 1 - self.k, 0))
    return block is None or all(g is not None for g in block.groups)

  def poll(self, prompt_len):
    with self._cv:
      self._polls += 1
      out = self._pop_released(prompt_len)
      if out:
        return out
      step, idle = self._next_step, not self._polled
      if not idle:
        if not self._needed_done(step):
          return []
        ready = self._ready_since.setdefault(step, self._polls)
        if self._polls - ready < self.every:
          return []
      key = (step, 0)
      while key not in self._admitted_at and not self._closed:
        self._cv.wait(timeout=1.0)  # the trainer admits it: wait
      if self._closed:
        return []
      self._released.add(key)
      self._next_step += 1
      version = self._admitted_at[key]
      self._revealed = max(version, self._revealed or version)
      return self._pop_released(prompt_len)

  def _pop_released(self, prompt_len):
    out = []
    while (
      self._queue
      and self._queue[0].tag[0] in self._released
      and len(self._queue[0].ids) <= prompt_len
    ):
      item = self._queue.popleft()
      self._polled[item.tag] = item
      out.append(item)
    return out
