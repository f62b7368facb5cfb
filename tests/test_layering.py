"""Folders of rljax import downward only.

Every `import rljax.X` / `from rljax.X import ...` in every module, at any
depth (a late import inside a function counts: it hides a cycle, it does
not remove it), must name a folder at or below the importer's layer.
"""

import ast
import os
import unittest

_ROOT = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rljax"
)

# Lowest first. A folder may import itself and any folder before it.
# `hostmem` (huge pages for the scripts' processes), `tracing` (what a
# profiler trace says) and `distributed` (jax.distributed start-up) import
# nothing of rljax; `study`
# (ablation runs with per-problem held-out records) and `instrument` (the
# small from-scratch decoder for long-horizon studies) drive the trainer.
# `envs` (multi-turn environments and tools) may use data and rewards; the
# engines will drive them, so they sit below rollout.
LAYERS = (
  "hostmem",
  "tracing",
  "distributed",
  "core",
  "quant",
  "models",
  "data",
  "rewards",
  "envs",
  "rollout",
  "train",
  "evaluation",
  "study",
  "instrument",
)
# Command-line entry points: they run training, then evaluation, so they sit
# above every folder (the training loop itself never imports evaluation).
ENTRY_POINTS = ("rljax.train.driver", "rljax.train.flags")


def _folder(module: str) -> str | None:
  """`rljax.models.decoder` -> "models"; None outside rljax or for `rljax`."""
  parts = module.split(".")
  if parts[0] != "rljax" or len(parts) < 2:
    return None
  return parts[1]


def _imports(path: str, package: str) -> set[str]:
  """The rljax modules one file imports (absolute names)."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # relative: resolve against the file's package
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module or ""
      if mod == "rljax":  # `from rljax import models`
        out.update(f"rljax.{a.name}" for a in node.names)
      else:
        out.add(mod)
  return out


def import_graph() -> dict[str, set[str]]:
  """folder -> the other rljax folders its modules import."""
  graph: dict[str, set[str]] = {}
  for dirpath, _, files in os.walk(_ROOT):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, os.path.dirname(_ROOT))[:-3]
      module = rel.replace(os.sep, ".")
      package = module if name == "__init__.py" else module.rsplit(".", 1)[0]
      package = package.removesuffix(".__init__")
      src = _folder(module)
      if src is None or src == "__init__" or module in ENTRY_POINTS:
        continue
      for dep in _imports(path, package):
        dst = _folder(dep)
        if dst is not None and dst != src:
          graph.setdefault(src, set()).add(dst)
  return graph


class LayeringTest(unittest.TestCase):
  def test_every_folder_has_a_layer(self):
    folders = {
      n.removesuffix(".py")
      for n in os.listdir(_ROOT)
      if not n.startswith("_") and n != "__pycache__"
    }
    self.assertEqual(folders - set(LAYERS), set())

  def test_imports_point_downward(self):
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
      f"{src} -> {dst}"
      for src, dsts in import_graph().items()
      for dst in dsts
      if rank[dst] > rank[src]
    )
    self.assertEqual(upward, [], f"upward imports; layers are {LAYERS}")


if __name__ == "__main__":
  for src, dsts in sorted(import_graph().items()):
    print(f"{src:>10} -> {', '.join(sorted(dsts))}")
