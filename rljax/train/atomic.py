"""Run files are replaced whole or not at all, and a full disk is named.

Every rewrite of a file in a run directory (config.json, the resume's cut of
metrics.jsonl, summary.json) goes through `write_text`: the new content is
written to a temporary file beside the old one, fsynced, then renamed over
it, and the directory is fsynced. A process killed at any point leaves
either the old file or the new one, never an empty or half-written file
(files that only grow, like metrics.jsonl between resumes, are appended).

A write that fails for lack of space raises `DiskFullError` naming the
directory and the bytes the write needed, and leaves no temporary file.
"""

from __future__ import annotations

import errno
import glob
import json
import os
from typing import Any


class DiskFullError(OSError):
  """No space left on the filesystem of a run directory."""

  def __init__(self, directory: str, needed: int, what: str = ""):
    super().__init__(
      errno.ENOSPC,
      f"no space left on {directory}: {needed} bytes needed"
      + (f" ({what})" if what else "")
      + "; free some space, then continue with --run.resume",
    )
    self.directory, self.needed = directory, needed


# How a full disk reads in the errors of C++ writers that are not OSErrors
# (orbax's TensorStore: "ValueError: RESOURCE_EXHAUSTED: ... No space left
# on device [os_error_code='28']").
_DISK_FULL_TEXT = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def is_disk_full(error: BaseException) -> bool:
  """Whether `error`, or an error it was raised from, is ENOSPC (or a
  quota): libraries such as orbax wrap the OSError of the write, or report
  it in their own exception's text."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (
      errno.ENOSPC,
      errno.EDQUOT,
    ):
      return True
    if any(t in str(error) for t in _DISK_FULL_TEXT):
      return True
    error = error.__cause__ or error.__context__
  return False


def fsync_dir(directory: str) -> None:
  """Makes a rename inside `directory` durable."""
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def write_text(path: str, text: str) -> None:
  """Replaces `path` with `text` atomically (temporary file, fsync, rename).

  Raises:
    DiskFullError: the filesystem has no room for `text`; `path` is left
      as it was and the temporary file is removed.
  """
  directory = os.path.dirname(os.path.abspath(path))
  # A killed rewrite's temporary (one process writes a run directory).
  for stale in glob.glob(glob.escape(path) + ".tmp*"):
    os.unlink(stale)
  tmp = f"{path}.tmp{os.getpid()}"
  data = text.encode("utf-8")
  try:
    with open(tmp, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    try:
      os.unlink(tmp)
    except FileNotFoundError:
      pass
    if is_disk_full(e):
      raise DiskFullError(directory, len(data), os.path.basename(path)) from e
    raise
  fsync_dir(directory)


def write_json(path: str, obj: Any, indent: int | None = 1) -> None:
  """`write_text` of `obj` as JSON."""
  write_text(path, json.dumps(obj, indent=indent))
