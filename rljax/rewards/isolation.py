"""Running reward code where a hang or crash cannot take the caller down.

Why a separate process: sympy can spend minutes inside one C-level big-integer
operation (``9^{9^{9^9}}``), which no signal-based timeout interrupts; only
killing a process bounds it. ``IsolatedWorker`` is one such process, started
with ``python -m rljax.rewards._worker_main`` (not ``multiprocessing``): a fresh
interpreter never re-runs the caller's ``__main__`` and never forks a
multithreaded JAX process. Messages are length-prefixed pickles on two pipes.

``time_limit`` is the in-process fallback (serial mode, tests): a SIGALRM
deadline, main thread only, which interrupts Python code but not C code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from typing import Any, Callable, Iterator, Literal

__all__ = [
  "CallResult",
  "IsolatedWorker",
  "ItemTimeout",
  "WorkerError",
  "in_isolated_worker",
  "time_limit",
]

_HEADER = struct.Struct("!Q")
_in_isolated_worker = False

Status = Literal["ok", "error", "timeout", "crash"]


class WorkerError(RuntimeError):
  """The worker process could not be started or initialised."""


class ItemTimeout(BaseException):
  """Raised inside ``time_limit`` when its deadline passes.

  A BaseException, like KeyboardInterrupt, so that library code which
  catches ``Exception`` (sympy, math-verify) cannot swallow it.
  """


@dataclasses.dataclass(frozen=True)
class CallResult:
  """Outcome of one call in a worker: ``value`` is the result when ``ok``,
  else a short message."""

  status: Status
  value: Any


def in_isolated_worker() -> bool:
  """True inside an ``IsolatedWorker`` process, whose parent enforces time."""
  return _in_isolated_worker


def _mark_isolated_worker() -> None:
  global _in_isolated_worker
  _in_isolated_worker = True


def write_message(fd: int, obj: Any) -> None:
  write_payload(fd, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def write_payload(fd: int, payload: bytes) -> None:
  data = memoryview(_HEADER.pack(len(payload)) + payload)
  while data:
    written = os.write(fd, data)
    data = data[written:]


def _read_exactly(fd: int, size: int) -> bytes | None:
  chunks = []
  while size > 0:
    chunk = os.read(fd, min(size, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    size -= len(chunk)
  return b"".join(chunks)


def read_message(fd: int) -> tuple[bool, Any]:
  """(True, obj), or (False, None) at end of file (the writer is gone)."""
  header = _read_exactly(fd, _HEADER.size)
  if header is None:
    return False, None
  payload = _read_exactly(fd, _HEADER.unpack(header)[0])
  if payload is None:
    return False, None
  return True, pickle.loads(payload)


def _child_environment() -> dict[str, str]:
  # The child must import the same modules (the target is pickled by
  # reference): give it the parent's import path.
  env = dict(os.environ)
  paths = [p if p else os.getcwd() for p in sys.path]
  env["PYTHONPATH"] = os.pathsep.join(paths)
  return env


def check_importable(target: Callable[..., Any]) -> None:
  """Raises ValueError if a worker process could not unpickle ``target``."""
  for obj in (target, type(target)):
    module = getattr(obj, "__module__", None)
    if module == "__main__":
      raise ValueError(
        f"reward function {target!r} is defined in __main__; a worker "
        "process imports it by module name, so define it in an "
        "importable module (or use mode='serial')."
      )
  try:
    pickle.dumps(target)
  except Exception as error:
    raise ValueError(
      f"reward function {target!r} cannot be pickled ({error}); use a "
      "module-level function or a dataclass instance (or mode='serial')."
    ) from error


class IsolatedWorker:
  """One child process that calls ``target(*args)`` for each item it is sent.

  Low-level use (``RewardPool``): ``start``, then select on ``fileno`` and
  ``receive`` the ``("ready", pid)`` message, then ``send``/``receive``
  ``(item_id, status, value)``; ``kill`` on timeout. ``call`` is the
  synchronous, thread-safe form with a timeout. ``warm_up`` (picklable, no
  arguments) runs in the child before it reports ready, so slow imports are
  not charged to the first item's timeout.
  """

  def __init__(
    self,
    target: Callable[..., Any],
    *,
    warm_up: Callable[[], Any] | None = None,
    startup_timeout_s: float = 120.0,
  ):
    self._target = target
    self._warm_up = warm_up
    self._startup_timeout_s = startup_timeout_s
    self._process: subprocess.Popen | None = None
    self._to_child: int | None = None
    self._from_child: int | None = None
    self.ready = False
    self._lock = threading.Lock()
    self._next_item = 0

  @property
  def alive(self) -> bool:
    return self._process is not None and self._process.poll() is None

  def fileno(self) -> int:
    if self._from_child is None:
      raise WorkerError("worker is not started")
    return self._from_child

  def start(self) -> None:
    """Starts the process and sends it the target; does not wait for it."""
    self.kill()
    parent_read, child_write = os.pipe()
    child_read, parent_write = os.pipe()
    try:
      self._process = subprocess.Popen(
        [
          sys.executable,
          "-m",
          "rljax.rewards._worker_main",
          str(child_read),
          str(child_write),
        ],
        pass_fds=(child_read, child_write),
        stdin=subprocess.DEVNULL,
        env=_child_environment(),
      )
    except OSError as error:
      for fd in (parent_read, child_write, child_read, parent_write):
        os.close(fd)
      raise WorkerError(
        f"could not start a reward worker process: {error}"
      ) from error
    os.close(child_read)
    os.close(child_write)
    self._to_child, self._from_child = parent_write, parent_read
    self.ready = False
    write_message(self._to_child, (self._target, self._warm_up))

  def send(self, item_id: int, args: tuple[Any, ...]) -> None:
    """Sends one item; raises BrokenPipeError if the process is gone."""
    if self._to_child is None:
      raise BrokenPipeError("worker is not started")
    write_message(self._to_child, (item_id, args))

  def receive(self) -> tuple[bool, Any]:
    """Blocks for the next message: (True, msg) or (False, None) if it died."""
    try:
      return read_message(self.fileno())
    except (OSError, EOFError, pickle.UnpicklingError):
      return False, None

  def wait_ready(self, timeout_s: float | None = None) -> None:
    """Blocks until the worker has loaded its target."""
    timeout_s = self._startup_timeout_s if timeout_s is None else timeout_s
    readable, _, _ = select.select([self.fileno()], [], [], timeout_s)
    if not readable:
      self.kill()
      raise WorkerError(f"reward worker did not start within {timeout_s:.0f} s")
    ok, message = self.receive()
    if not ok:
      code = self._process.wait() if self._process else None
      self.kill()
      raise WorkerError(
        f"reward worker exited during start-up (exit code {code})"
      )
    if message[0] != "ready":
      self.kill()
      raise WorkerError(
        f"reward worker could not load its target: {message[1]}"
      )
    self.ready = True

  def kill(self) -> None:
    """Ends the process (SIGKILL: a hung C call ignores anything softer)."""
    # A repeating ``time_limit`` alarm must not cut the clean-up short and
    # leave a live process behind: hold SIGALRM until it is done.
    with _alarm_blocked():
      self._kill()

  def _kill(self) -> None:
    for fd in (self._to_child, self._from_child):
      if fd is not None:
        with contextlib.suppress(OSError):
          os.close(fd)
    self._to_child = self._from_child = None
    if self._process is not None:
      with contextlib.suppress(OSError):
        self._process.kill()
      with contextlib.suppress(Exception):
        self._process.wait(timeout=10)
    self._process = None
    self.ready = False

  def call(self, args: tuple[Any, ...], timeout_s: float) -> CallResult:
    """Runs ``target(*args)`` in the process; never raises, never blocks
    longer than ``timeout_s`` (plus the first start-up)."""
    with self._lock:
      try:
        if not (self.alive and self.ready):
          self.start()
          self.wait_ready()
        self._next_item += 1
        self.send(self._next_item, args)
        readable, _, _ = select.select([self.fileno()], [], [], timeout_s)
        if not readable:
          self.kill()
          return CallResult("timeout", f"no result within {timeout_s} s")
        ok, message = self.receive()
        if not ok:
          self.kill()
          return CallResult("crash", "worker process died")
        item_id, status, value = message
        if item_id != self._next_item:
          self.kill()
          return CallResult(
            "crash",
            f"worker answered item {item_id}, expected {self._next_item}",
          )
        return CallResult(status, value)
      except (OSError, WorkerError) as error:
        self.kill()
        return CallResult("crash", f"{type(error).__name__}: {error}")
      except BaseException:
        # Interrupted mid-call (KeyboardInterrupt, ItemTimeout): the
        # worker may still answer this item later, so it cannot be
        # reused for the next one.
        self.kill()
        raise

  def __del__(self):
    with contextlib.suppress(Exception):
      self.kill()


@contextlib.contextmanager
def _alarm_blocked() -> Iterator[None]:
  if threading.current_thread() is not threading.main_thread() or not hasattr(
    signal, "pthread_sigmask"
  ):
    yield
    return
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
  """Raises ``ItemTimeout`` in the guarded block after ``seconds``.

  Main thread only (elsewhere, and for ``None``, it does nothing). Once the
  deadline has passed the alarm repeats every 50 ms, so code that swallows
  the first exception is interrupted again. Not re-entrant.
  """
  if (
    seconds is None or threading.current_thread() is not threading.main_thread()
  ):
    yield
    return
  active = True

  def on_alarm(signum, frame):
    if active:
      raise ItemTimeout(f"time limit of {seconds} s exceeded")

  previous = signal.signal(signal.SIGALRM, on_alarm)
  signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3), 0.05)
  try:
    yield
  finally:
    # Order matters: disarm the handler before the timer, so an alarm that
    # lands during clean-up is ignored instead of escaping.
    try:
      active = False
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, previous)
