"""The Python tool's call, seen from the trainer: its output and its verdict.

``collect`` feeds the request to the supervisor (``_sandbox_child.py``),
drains stdout, stderr and the report pipe without ever blocking the code on
a full pipe, stops at the deadline, and judges the call from what the code
cannot forge: the cgroup's OOM count, the clock, init's report (set-up,
syntax, or the worker's wait status) or, without one, the supervisor's exit
status. Only the message of an exception that escaped the code comes from
the code's side (its last stderr line, after ``MESSAGE_MARK``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from typing import NamedTuple

from rljax.envs import _sandbox_child as child

__all__ = ["Outcome", "collect", "kill_group", "kill_uid"]


class Outcome(NamedTuple):
  """What a call ended in (``sandbox.SandboxResult`` without the timing)."""

  kind: str
  stdout: str
  stderr: str
  message: str
  truncated: bool


def kill_group(process: subprocess.Popen) -> None:
  """SIGKILLs the supervisor's process group, then reaps the supervisor."""
  # Once the leader is reaped its pid may be reused: only signal it before.
  if process.returncode is None:
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  try:
    process.wait(timeout=10)
  except subprocess.TimeoutExpired:
    pass


def kill_uid(uid: int) -> None:
  """SIGKILL every process whose real uid is ``uid`` (a fresh sandbox uid:
  nothing else runs under it), until none is left."""
  for _ in range(100):
    found = False
    for entry in os.listdir("/proc"):
      if not entry.isdigit():
        continue
      try:
        with open(f"/proc/{entry}/status") as f:
          fields = dict(line.split(":", 1) for line in f if ":" in line)
        # A zombie is dead already; its parent (or init) reaps it.
        if int(fields["Uid"].split()[0]) == uid and "Z" not in fields["State"]:
          found = True
          os.kill(int(entry), signal.SIGKILL)
      except (OSError, KeyError, ValueError):
        continue
    if not found:
      return
    time.sleep(0.01)


def collect(process, request, status_fd, config, group, deadline) -> Outcome:
  """Sends ``request``, reads the call's output and report until the
  supervisor exits or ``deadline`` (time.monotonic()) passes, and judges
  the outcome (``_verdict``). ``config`` is the call's SandboxConfig,
  ``group`` its CallGroup or None."""
  try:
    process.stdin.write(json.dumps(request).encode())
    process.stdin.close()
  except OSError:
    pass
  limit = config.max_output_chars * 4  # UTF-8: at most 4 bytes a character
  out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
  buffers = {out_fd: bytearray(), err_fd: bytearray(), status_fd: bytearray()}
  err_tail = bytearray()  # the worker's message line ends stderr
  overflow = False
  open_fds = set(buffers)
  timed_out = False

  def take(fd: int, chunk: bytes) -> None:
    nonlocal overflow, err_tail
    buffer = buffers[fd]
    room = (65536 if fd == status_fd else limit) - len(buffer)
    if fd == err_fd:
      err_tail = (err_tail + chunk)[-child._MESSAGE_BYTES - 64 :]
    if len(chunk) > room:
      overflow = overflow or fd != status_fd
    buffer += chunk[: max(room, 0)]

  while open_fds:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      timed_out = True
      break
    # Short waits: end of file is not the only signal that the call is over.
    readable, _, _ = select.select(list(open_fds), [], [], min(remaining, 0.05))
    for fd in readable:
      chunk = os.read(fd, 65536)
      if chunk:
        take(fd, chunk)
      else:
        open_fds.discard(fd)
    if process.poll() is not None:
      # The supervisor has exited, so all that was written is in the pipes:
      # take it without waiting for end of file (the group is killed next).
      for fd in open_fds:
        os.set_blocking(fd, False)
        try:
          while chunk := os.read(fd, 65536):
            take(fd, chunk)
        except BlockingIOError:
          pass
      break
  if timed_out:
    kill_group(process)
  report = _first_report(buffers[status_fd])
  kind, message = _verdict(process, report, config, group, timed_out)
  stderr_raw = buffers[err_fd]
  if report.get("kind") == "exited" and _exit_code(report) in _CODE_KINDS:
    message, stderr_raw = _message(stderr_raw, err_tail, message)
  stdout, stdout_cut = _text(buffers[out_fd], config)
  stderr, stderr_cut = _text(stderr_raw, config)
  truncated = overflow or stdout_cut or stderr_cut
  return Outcome(kind, stdout, stderr, message, truncated)


_CODE_KINDS = {code: kind for kind, code in child.EXIT_CODES.items()}


def _first_report(raw: bytearray) -> dict:
  try:
    report = json.loads(bytes(raw).split(b"\n", 1)[0].decode())
    return report if isinstance(report, dict) else {}
  except ValueError:
    return {}


def _exit_code(report: dict) -> int | None:
  status = report.get("status")
  if not isinstance(status, int) or not os.WIFEXITED(status):
    return None
  return os.WEXITSTATUS(status)


def _verdict(process, report, config, group, timed_out) -> tuple[str, str]:
  """The call's kind and message, from what the code cannot forge: the
  cgroup's OOM count, the clock, the report of init (setup, syntax, or the
  worker's wait status) or, without one, the supervisor's exit status."""
  if group is not None and group.oom_kills() > 0:
    return "memory", (
      f"the call's processes together went past memory_mb="
      f"{config.memory_mb} MB (the cgroup's memory cap killed a process)"
    )
  if timed_out:
    return "timeout", f"no result within {config.timeout_s} s (wall time)"
  kind = report.get("kind")
  if kind in ("setup", "syntax"):
    return kind, str(report.get("message", ""))
  if kind != "exited" or not isinstance(report.get("status"), int):
    code = process.wait()
    return "crash", f"the sandbox died before reporting (exit status {code})"
  status = report["status"]
  if os.WIFSIGNALED(status):
    number = os.WTERMSIG(status)
    if number == signal.SIGXCPU:
      return "timeout", f"CPU time limit of {config.cpu_s} s"
    return "crash", f"killed by signal {signal.Signals(number).name}"
  code = os.WEXITSTATUS(status)
  if code == 0:
    return "ok", ""
  if code in _CODE_KINDS:
    return _CODE_KINDS[code], ""  # the message is on stderr (_message)
  return "crash", f"the program exited with status {code}"


def _message(raw: bytearray, tail: bytearray, default: str):
  """The worker's message (its last stderr line, after MESSAGE_MARK) and
  stderr without that line."""
  mark = child.MESSAGE_MARK
  at = tail.rfind(mark)
  message = default
  if at >= 0:
    message = bytes(tail[at + 1 :]).decode("utf-8", "replace").rstrip("\n")
  cut = raw.rfind(mark)
  return message, (raw[:cut] if cut >= 0 else raw)


def _text(raw: bytearray, config) -> tuple[str, bool]:
  text = bytes(raw).decode("utf-8", errors="replace")
  if len(text) > config.max_output_chars:
    return text[: config.max_output_chars], True
  return text, False
