"""User errors on the command line: the message and exit status 2.

A script's user error (a bad flag value, a grid typo, a missing `--configs`
file, an unknown model, a resume refused, a run directory in use) is
reported as `error: <message>` on stderr with exit status 2, the status
absl gives a flag it cannot parse; a traceback is printed only for a bug.
Every script under experiments/ starts through `run(main)` in place of
`absl.app.run(main)`, so they all draw the line in one place:
`user_error_types`.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app

EXIT_USER_ERROR = 2


class UsageError(ValueError):
  """What the user asked for cannot be done as asked (a script's own check).

  A ValueError, so code that checks arguments keeps raising what callers of
  its functions expect; `run` reports it without a traceback."""


def user_error_types() -> tuple[type[BaseException], ...]:
  """The exceptions that are the user's to fix, not bugs of rljax."""
  # Imported here: the config package needs no jax, the run directory's
  # module does (orbax), and a script's --help should not pay for it.
  from rljax.data.records import DataError
  from rljax.train.config import ConfigError
  from rljax.train.rundir import (
    ConfigChangeError,
    RunDirExistsError,
    RunDirLockedError,
  )

  return (
    UsageError,
    app.UsageError,
    ConfigError,
    ConfigChangeError,
    RunDirExistsError,
    RunDirLockedError,
    DataError,
  )


def report(error: BaseException) -> int:
  """Prints `error: <message>` on stderr; returns the exit status."""
  print(f"error: {error}", file=sys.stderr, flush=True)
  return EXIT_USER_ERROR


def guarded(
  main: Callable[[list[str]], object],
) -> Callable[[list[str]], object]:
  """`main` with a user error turned into its message and exit status 2."""

  def call(argv):
    try:
      return main(argv)
    except user_error_types() as e:  # pylint: disable=catching-non-exception
      sys.exit(report(e))

  return call


def run(main: Callable[[list[str]], object]) -> None:
  """`absl.app.run(main)`, user errors reported without a traceback."""
  app.run(guarded(main))
