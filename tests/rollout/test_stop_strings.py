"""The stop-string automaton over tokens: it ends a turn at the token that
completes a stop string, wherever the tokenizer split it, and never on a
'>' that closes nothing."""

import hypothesis
import hypothesis.strategies as st
import pytest

from rljax.models.pretrained import tiny_tokenizer
from rljax.rollout.stop_strings import build_matcher, stop_matcher

# Token texts over the stop strings' characters and others, so that random
# sequences split the stops everywhere.
_PIECES = ["<", "/", ">", "a", "b", "</", "a>", "b>x", "</a", "x", "ab", "/a>"]
_PIECES += ["x</b>y", "\ufffd", "<a", "></"]


def _first_stop_by_text(texts, ids, stops):
  for k in range(1, len(ids) + 1):
    text = "".join(texts[t] for t in ids[:k])
    if any(s in text for s in stops):
      return k
  return None


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
  ids=st.lists(st.integers(0, len(_PIECES) - 1), max_size=20),
  stops=st.sampled_from([("</a>",), ("</a>", "</b>"), ("a>",), ("/a>", "ab")]),
)
def test_first_stop_is_where_the_text_first_holds_a_stop(ids, stops):
  matcher = build_matcher(_PIECES, stops)
  assert matcher.first_stop(ids) == _first_stop_by_text(_PIECES, ids, stops)
  # Fed in two parts with the state carried: the same answer.
  cut = len(ids) // 2
  head = matcher.first_stop(ids[:cut])
  if head is None:
    tail = matcher.first_stop(ids[cut:], matcher.state_after(ids[:cut]))
    expected = _first_stop_by_text(_PIECES, ids, stops)
    assert (None if tail is None else cut + tail) == expected


def test_real_tokenizer_stops_at_the_closing_tag_only():
  tok = tiny_tokenizer()
  matcher = stop_matcher(tok, ("</calculator>",))
  text = "Let me see <calculator>19*3</calculator> and more"
  ids = tok.encode(text, add_special_tokens=False)
  k = matcher.first_stop(ids)
  assert k is not None
  assert "</calculator>" in tok.decode(ids[:k])
  assert "</calculator>" not in tok.decode(ids[: k - 1])
  # The opening tag's '>' (and any other '>') is no stop.
  opening = tok.encode("x <calculator>1 > 0", add_special_tokens=False)
  assert matcher.first_stop(opening) is None
  assert matcher.num_states == len("</calculator>") + 1


def test_bad_stop_strings_are_named():
  with pytest.raises(ValueError, match="stop_sequences=\\(\\)"):
    build_matcher(["a"], ())
  with pytest.raises(ValueError, match="do not begin with whitespace"):
    build_matcher(["a"], (" </a>",))
