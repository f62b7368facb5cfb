"""Loaders: the shared benchmark files, field maps, and bad input."""

import json
import os

import pytest

from rljax import data, rewards

SHARED_DATA = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data"
)
needs_shared_data = pytest.mark.skipif(
  not os.path.isdir(SHARED_DATA),
  reason=f"benchmark files not found at {os.path.normpath(SHARED_DATA)}",
)


def shared(path):
  return os.path.join(SHARED_DATA, path)


@needs_shared_data
class TestSharedFiles:
  @pytest.mark.parametrize(
    "name,path,count,first_answer",
    [
      ("gsm8k", "gsm8k/test.jsonl", 1319, "18"),
      ("gsm8k", "gsm8k/train.jsonl", 7473, "72"),
      (
        "math500",
        "math500/test.jsonl",
        500,
        "\\left( 3, \\frac{\\pi}{2} \\right)",
      ),
      ("aime24", "aime24/test.jsonl", 30, "204"),
      ("amc23", "amc23/test.jsonl", 40, "27"),  # stored as the float 27.0
      (
        "minerva_math",
        "minerva_math/test.jsonl",
        272,
        "1.6",
      ),  # last \boxed{} of the solution
    ],
  )
  def test_counts_and_answers(self, name, path, count, first_answer):
    ds = data.load_dataset(name, shared(path))
    assert len(ds) == count
    assert ds.stats.loaded == count and ds.stats.skipped == 0
    assert ds[0].answer == first_answer
    assert ds[0].metadata["verifier"] == "math"
    assert ds[0].question.strip()
    assert len({ex.uid for ex in ds}) == count

  def test_gsm8k_answers_are_plain_numbers(self):
    ds = data.load_dataset("gsm8k", shared("gsm8k/test.jsonl"))
    assert all(rewards.equivalence.parse_plain_number(ex.answer) for ex in ds)
    assert "," not in "".join(ex.answer for ex in ds)  # "1,080" -> "1080"

  def test_minerva_keeps_the_solution(self):
    ds = data.load_dataset("minerva_math", shared("minerva_math/test.jsonl"))
    assert "\\boxed{1.6}" in ds[0].metadata["solution"]

  def test_ground_truths_verify_against_themselves(self):
    # Extraction + equivalence agree with the datasets' own answer strings.
    ds = data.load_dataset("math500", shared("math500/test.jsonl"))
    for ex in ds[:60]:
      assert (
        rewards.math_reward(
          f"The answer is $\\boxed{{{ex.answer}}}$.", ex.answer
        )
        == 1.0
      ), ex.answer


def write_lines(tmp_path, lines, name="rows.jsonl"):
  path = tmp_path / name
  with open(path, "wb") as handle:
    for line in lines:
      handle.write(line if isinstance(line, bytes) else line.encode("utf-8"))
      handle.write(b"\n")
  return str(path)


MAP = data.FieldMap(question="problem", answer="answer")


class TestBadInput:
  @pytest.mark.parametrize(
    "bad_line,kind,message",
    [
      ('{"problem": "q2"}', "missing_field", "no answer field answer"),
      ('{"answer": "1"}', "missing_field", "no question field problem"),
      (
        '{"problem": "q2", "answer": ""}',
        "bad_answer",
        "no answer could be read",
      ),
      (
        '{"problem": "q2", "answer": {"x": 1}}',
        "bad_answer",
        "no answer could be read",
      ),
      ('{"problem": "q2", "answer": ', "invalid_json", "invalid JSON"),
      # 200,000 levels deep is a named, skippable row, not a RecursionError.
      (
        '{"problem": ' + "[" * 200_000 + "]" * 200_000 + "}",
        "invalid_json",
        "invalid JSON \\(nested too deeply\\)",
      ),
      # A non-finite gold answer is skipped: no completion can equal NaN.
      ('{"problem": "q2", "answer": "NaN"}', "bad_answer", "no answer"),
      ('{"problem": "q2", "answer": "-inf"}', "bad_answer", "no answer"),
      ("[1, 2]", "not_object", "row is a JSON list"),
      (
        b'{"problem": "caf\xe9", "answer": "1"}',
        "not_utf8",
        "not valid UTF-8 \\(byte 0xe9",
      ),
    ],
  )
  def test_raise_names_file_and_line(self, tmp_path, bad_line, kind, message):
    path = write_lines(
      tmp_path,
      [
        '{"problem": "q1", "answer": "1"}',
        "",
        bad_line,
        '{"problem": "q3", "answer": 3}',
      ],
    )
    with pytest.raises(data.DataError, match=f"rows.jsonl:3: {message}"):
      data.load_jsonl(path, MAP)
    ds = data.load_jsonl(path, MAP, on_error="skip")
    assert [ex.answer for ex in ds] == ["1", "3"]
    assert ds.stats.rows == 3 and ds.stats.loaded == 2 and ds.stats.skipped == 1
    assert ds.stats.skip_reasons == {kind: 1}
    assert "rows.jsonl:3: " in ds.stats.first_errors[0]

  def test_empty_file(self, tmp_path):
    path = write_lines(tmp_path, [], name="empty.jsonl")
    with pytest.raises(data.DataError, match="empty.jsonl: no rows"):
      data.load_jsonl(path, MAP)
    ds = data.load_jsonl(path, MAP, on_error="skip")
    assert len(ds) == 0 and ds.stats.skip_reasons == {"empty_file": 1}

  def test_missing_file_and_bad_options(self, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
      data.load_jsonl(str(tmp_path / "nope.jsonl"), MAP)
    path = write_lines(tmp_path, ['{"problem": "q", "answer": "1"}'])
    with pytest.raises(ValueError, match="on_error"):
      data.load_jsonl(path, MAP, on_error="ignore")
    with pytest.raises(ValueError, match="unknown dataset"):
      data.load_dataset("mmlu", path)
    with pytest.raises(ValueError, match="format"):
      data.load_file(str(tmp_path / "rows.csv"), MAP)


class TestFieldMaps:
  def test_candidates_extractor_and_metadata(self, tmp_path):
    rows = [
      {"question": "q1", "final_answer": ["\\frac12"], "level": 3},
      {"problem": "q2", "answer": 7.0, "level": 1},
    ]
    path = write_lines(
      tmp_path, [json.dumps(r) for r in rows], name="olympiad.jsonl"
    )
    ds = data.load_dataset("olympiadbench", path)
    assert [(ex.question, ex.answer) for ex in ds] == [
      ("q1", "\\frac12"),
      ("q2", "7"),
    ]
    assert ds[0].metadata == {
      "level": 3,
      "verifier": "math",
      "source": "olympiadbench/olympiad",
    }
    assert ds[1].uid == "olympiadbench/olympiad:1"

  def test_a_new_dataset_is_a_few_lines(self):
    custom = data.FieldMap(
      question="prompt",
      answer="response",
      answer_extractor=lambda s: s.split("=")[-1],
      extra_fields=("id",),
    )
    ds = data.from_records(
      [{"prompt": "2+2?", "response": "2+2=4", "id": 9, "junk": 1}],
      custom,
      name="mine",
    )
    assert ds[0].answer == "4" and ds[0].metadata == {
      "id": 9,
      "verifier": "math",
      "source": "mine",
    }

  def test_question_composed_from_several_fields(self, tmp_path):
    # SVAMP rows: the story and the ask live in two fields.
    rows = [
      {
        "ID": "chal-1",
        "Body": "Jack had 8 pens. He gave 3 away. ",
        "Question": "How many pens does he have now?",
        "Equation": "( 8.0 - 3.0 )",
        "Answer": 5.0,
        "Type": "Subtraction",
      },
      {
        "ID": "chal-2",
        "Body": "A box holds 1,200 beads.",
        "Question": "How many beads are in 2 boxes?",
        "Answer": 2400,
      },
    ]
    path = write_lines(
      tmp_path, [json.dumps(r) for r in rows], name="svamp.jsonl"
    )
    ds = data.load_dataset("svamp", path)
    assert (
      ds[0].question
      == "Jack had 8 pens. He gave 3 away. How many pens does he have now?"
    )
    assert [ex.answer for ex in ds] == ["5", "2400"]
    # Composed fields are not repeated in the metadata; the rest is kept.
    assert ds[0].metadata == {
      "ID": "chal-1",
      "Equation": "( 8.0 - 3.0 )",
      "Answer": 5.0,
      "Type": "Subtraction",
      "verifier": "math",
      "source": "svamp/svamp",
    }

  def test_composed_question_missing_part_is_named(self, tmp_path):
    path = write_lines(
      tmp_path,
      [json.dumps({"Body": "Jack had 8 pens.", "Answer": 8})],
      name="svamp.jsonl",
    )
    with pytest.raises(
      data.DataError,
      match=r"svamp.jsonl:1: question part 'Question' of Body\+Question is missing",
    ):
      data.load_dataset("svamp", path)
    assert data.load_dataset(
      "svamp", path, on_error="skip"
    ).stats.skip_reasons == {"missing_field": 1}

  @pytest.mark.parametrize(
    "value,answer",
    [
      ("9 (apples)", "9"),
      ("1,200 dollars", "1200"),
      ("3\u2009600", "3600"),
      (3.0, "3"),
      (2.5, "2.5"),
      ("0.75 (liters)", "0.75"),
      ("2/3", "2/3"),
      ("", None),
    ],
  )
  def test_number_answer(self, value, answer):
    assert data.specs.number_answer(value) == answer

  def test_asdiv_answers_with_units_grade(self):
    # ASDiv writes answers with their unit; the ground truth is the number.
    from rljax import rewards

    custom = data.specs.ASDIV
    ds = data.from_records(
      [
        {
          "Body": "Tom has 4 apples and buys 5.",
          "Question": "How many apples now?",
          "Answer": "9 (apples)",
        }
      ],
      custom,
      name="asdiv",
    )
    assert (ds[0].question, ds[0].answer) == (
      "Tom has 4 apples and buys 5. How many apples now?",
      "9",
    )
    assert rewards.math_reward("The answer is 9 apples.", ds[0].answer) == 1.0
    assert rewards.math_reward("The answer is 10 apples.", ds[0].answer) == 0.0

  def test_svamp_as_distributed_joins_sentences(self, tmp_path):
    # Rows as SVAMP ships them (SVAMP.json, one object per line here). A
    # third of the bodies end in a clause without a full stop; joined as
    # they are, "... on each pack How much ..." would be a run-on sentence.
    rows = [
      {
        "ID": "chal-1",
        "Body": "Each pack of dvds costs 76 dollars. If there is a discount "
        "of 25 dollars on each pack",
        "Question": "How much do you have to pay to buy each pack?",
        "Equation": "( 76.0 - 25.0 )",
        "Answer": 51.0,
        "Type": "Subtraction",
      },
      {
        "ID": "chal-2",
        "Body": "Dan had $ 3 left with him after he bought a candy bar. If "
        "he had $ 4 at the start.",
        "Question": "How much did the candy bar cost?",
        "Equation": "( 4.0 - 3.0 )",
        "Answer": 1.0,
        "Type": "Subtraction",
      },
    ]
    path = write_lines(
      tmp_path, [json.dumps(r) for r in rows], name="svamp.jsonl"
    )
    ds = data.load_dataset("svamp", path)
    assert ds[0].question == (
      "Each pack of dvds costs 76 dollars. If there is a discount of 25 "
      "dollars on each pack. How much do you have to pay to buy each pack?"
    )
    assert ds[1].question.endswith(
      "at the start. How much did the candy bar cost?"
    )
    assert [ex.answer for ex in ds] == ["51", "1"]

  def test_asdiv_as_distributed_lower_case_fields(self, tmp_path):
    # ASDiv's JSON Lines release writes body / question / answer in lower
    # case, with the unit after the number; a loader that read only
    # "Body"/"Question"/"Answer" would skip every row.
    rows = [
      {
        "body": "Seven red apples and two green apples are in the basket.",
        "question": "How many apples are in the basket?",
        "solution_type": "Addition",
        "answer": "9 (apples)",
        "formula": "7+2=9",
      },
      {
        "body": "Ellen has six more balls than Marin. Marin has nine balls.",
        "question": "How many balls does Ellen have?",
        "solution_type": "Addition",
        "answer": "15 (balls)",
        "formula": "6+9=15",
      },
    ]
    path = write_lines(
      tmp_path, [json.dumps(r) for r in rows], name="asdiv.jsonl"
    )
    ds = data.load_dataset("asdiv", path)
    assert ds.stats.skipped == 0
    assert (ds[0].question, ds[0].answer) == (
      "Seven red apples and two green apples are in the basket. How many "
      "apples are in the basket?",
      "9",
    )
    assert ds[1].answer == "15"
    assert ds[0].metadata["formula"] == "7+2=9"
    assert "body" not in ds[0].metadata  # the question's parts are not kept

  def test_compose_rejects_no_fields(self):
    with pytest.raises(ValueError, match="Compose fields"):
      data.Compose()

  @pytest.mark.parametrize(
    "value,text",
    [
      (27.0, "27"),
      (0.5, "0.5"),
      (3, "3"),
      (["1", 2], "1, 2"),
      ([], None),
      (True, None),
      (float("nan"), None),
    ],
  )
  def test_answer_text(self, value, text):
    assert data.records.answer_text(value) == text


def test_parquet(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq

  path = str(tmp_path / "rows.parquet")
  pq.write_table(
    pa.table({"problem": ["q1", "q2"], "answer": ["1", None]}), path
  )
  with pytest.raises(
    data.DataError, match="rows.parquet:row 2: no answer field"
  ):
    data.load_parquet(path, MAP)
  ds = data.load_file(path, MAP, on_error="skip")
  assert [ex.answer for ex in ds] == ["1"] and ds.stats.skipped == 1
