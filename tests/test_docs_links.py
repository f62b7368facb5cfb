"""Every relative link and image in the tracked Markdown files resolves.

A link or image whose target is a path must name a tracked file (or a
folder holding one), relative to the Markdown file that holds it; a link
with a `#fragment` into a Markdown file must name one of that file's
headings, slugged as GitHub slugs them (lowercase, punctuation dropped,
spaces to hyphens, a repeated slug numbered -1, -2, ...). Links inside
code (fenced blocks, inline code spans) are text, not links. A failure
names every broken link as `file: link (why)`.
"""

import functools
import os
import re
import subprocess
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# [text](target "title") and ![alt](target); text may hold one level of
# nested brackets (an image inside a link).
_INLINE = re.compile(
  r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)"
)
# [label]: target
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
# <img src="..."> and <a href="...">
_HTML = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)
_HTML_ID = re.compile(r"<a\b[^>]*?\b(?:name|id)=\"([^\"]+)\"", re.I)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def _tracked_files():
  """The repository's tracked files, as paths relative to its root."""
  try:
    out = subprocess.run(
      ["git", "ls-files", "-z"],
      cwd=ROOT,
      check=True,
      capture_output=True,
    ).stdout.decode()
    return {p for p in out.split("\0") if p}
  except (OSError, subprocess.CalledProcessError):
    found = set()
    for base, dirs, files in os.walk(ROOT):
      dirs[:] = [d for d in dirs if not d.startswith(".")]
      for name in files:
        found.add(os.path.relpath(os.path.join(base, name), ROOT))
    return found


def _prose_lines(text):
  """The lines of a Markdown text outside fenced code blocks, numbered."""
  fence = None
  for number, line in enumerate(text.split("\n"), 1):
    match = _FENCE.match(line)
    if match:
      if fence is None:
        fence = match.group(1)
      elif match.group(1) == fence:
        fence = None
      continue
    if fence is None:
      yield number, line


def slug(heading):
  """GitHub's anchor for a heading's text, before de-duplication."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
  text = re.sub(r"<[^>]+>", "", text)
  text = text.strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
  """Every anchor a Markdown file defines: its headings and HTML ids."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    text = f.read()
  seen = {}
  found = set()
  previous = ""
  for _, line in _prose_lines(text):
    heading = _HEADING.match(line)
    if heading is None and previous.strip() and re.match(r"^(=+|-+)\s*$", line):
      heading = re.match(r"()(.*)", previous.strip())  # a setext heading
    if heading is not None:
      base = slug(heading.group(2))
      count = seen.get(base, 0)
      seen[base] = count + 1
      found.add(base if count == 0 else f"{base}-{count}")
    found.update(m.group(1) for m in _HTML_ID.finditer(line))
    previous = line
  return frozenset(found)


def links(text):
  """(line number, target) of every link and image outside code."""
  for number, line in _prose_lines(text):
    bare = _CODE_SPAN.sub("", line)
    for match in _INLINE.finditer(bare):
      yield number, match.group(1).strip("<>")
    for pattern in (_REFERENCE, _HTML):
      for match in pattern.finditer(bare):
        yield number, match.group(1)


def problem(md_path, target, tracked, folders):
  """Why `target`, linked from `md_path`, does not resolve (None if it does)."""
  if _SCHEME.match(target):
    return None
  path, _, fragment = target.partition("#")
  path = urllib.parse.unquote(path)
  fragment = urllib.parse.unquote(fragment)
  if path:
    if path.startswith("/"):
      resolved = os.path.normpath(path.lstrip("/"))
    else:
      resolved = os.path.normpath(os.path.join(os.path.dirname(md_path), path))
    if resolved.startswith(".."):
      return "outside the repository"
    if resolved not in tracked and resolved not in folders:
      return "no such tracked file"
  else:
    resolved = md_path
  if fragment and resolved.endswith(".md") and resolved in tracked:
    if fragment.lower() not in anchors(resolved):
      return f"no heading #{fragment} in {resolved}"
  return None


def test_every_relative_link_resolves():
  tracked = _tracked_files()
  folders = set()
  for path in tracked:
    parent = os.path.dirname(path)
    while parent and parent not in folders:
      folders.add(parent)
      parent = os.path.dirname(parent)
  markdown = sorted(p for p in tracked if p.endswith(".md"))
  assert "README.md" in markdown
  broken = []
  for md_path in markdown:
    with open(os.path.join(ROOT, md_path), encoding="utf-8") as f:
      text = f.read()
    for number, target in links(text):
      why = problem(md_path, target, tracked, folders)
      if why:
        broken.append(f"{md_path}:{number}: {target} ({why})")
  assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_follows_github():
  assert slug("2026-11-27: RoPE tables, and the prompt's keys") == (
    "2026-11-27-rope-tables-and-the-prompts-keys"
  )
  assert slug("The `tiny` model: 2× faster") == "the-tiny-model-2-faster"
  assert slug("Set-up: two commands") == "set-up-two-commands"


def test_a_broken_link_is_named():
  """The checker reports a missing file, a missing heading, an escape."""
  tracked = {"README.md", "docs/a.md"}
  assert (
    problem("docs/a.md", "../README.md#set-up-two-commands", tracked, set())
    is None
  )
  assert problem(
    "docs/a.md", "../README.md#no-such-heading", tracked, set()
  ) == ("no heading #no-such-heading in README.md")
  assert problem("README.md", "docs/a.md", tracked, {"docs"}) is None
  assert problem("README.md", "docs", tracked, {"docs"}) is None
  assert problem("README.md", "docs/b.md", tracked, {"docs"}) == (
    "no such tracked file"
  )
  assert problem("docs/a.md", "../../x.md", tracked, set()) == (
    "outside the repository"
  )
  assert problem("README.md", "https://example.com/x", tracked, set()) is None
  found = list(links("[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n![d](e.png)"))
  assert found == [(1, "x.md"), (5, "e.png")]
