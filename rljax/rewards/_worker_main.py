"""Entry point of an ``IsolatedWorker`` process (see isolation.py).

Usage (by ``IsolatedWorker`` only): ``python -m rljax.rewards._worker_main
READ_FD WRITE_FD``. Reads the pickled (target, warm_up), runs warm_up,
answers ``("ready", pid)``, then
answers each ``(item_id, args)`` with ``(item_id, status, value)`` until the
parent closes the pipe.
"""

from __future__ import annotations

import os
import pickle
import sys

from rljax.rewards import isolation


def _describe(error: BaseException) -> str:
  try:
    return f"{type(error).__name__}: {error}"[:2000]
  except Exception:
    return type(error).__name__


def main(argv: list[str]) -> int:
  read_fd, write_fd = int(argv[1]), int(argv[2])
  isolation._mark_isolated_worker()
  try:
    ok, init = isolation.read_message(read_fd)
    if not ok:
      return 0
    target, warm_up = init
    if warm_up is not None:
      warm_up()
  except BaseException as error:  # an unimportable target: report, then stop
    isolation.write_message(write_fd, ("init_error", _describe(error)))
    return 1
  isolation.write_message(write_fd, ("ready", os.getpid()))
  while True:
    ok, message = isolation.read_message(read_fd)
    if not ok:
      return 0
    item_id, args = message
    try:
      reply = pickle.dumps(
        (item_id, "ok", target(*args)), protocol=pickle.HIGHEST_PROTOCOL
      )
    except KeyboardInterrupt:
      raise
    except BaseException as error:
      reply = pickle.dumps((item_id, "error", _describe(error)))
    isolation.write_payload(write_fd, reply)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
