"""The dataset schema: what loads, and the exact message for each kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.dataset import DEFAULT_DATASET, DatasetError, load_dataset, load_datasets
from tests.evals.eval_helpers import write_dataset

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
version: 1
description: "tiny"
defaults:
  as: {sub: eval-user, roles: [business_staff], domains: [acme]}
rows:
  - id: doc-alert-cooldown
    question: "How long is the alert cooldown?"
    tools_called: {all: [search_docs], none: [get_building]}
    tool_args: {search_docs: {query: "cooldown"}}
    cited_sources: [documentation/user/occupancy-alerts.md]
    keywords: {all: ["10 minutes"], any: [cooldown, quiet]}
    forbidden: [KESTREL-7]
    idk: false
    decision: answered
    tags: [doc]
  - id: off-topic.poem
    question: "Write me a poem"
    as: {sub: nina, roles: [admin], domains: []}
    declined: true
    rubric: "It declines politely."
    xfail: {models: [qwen2.5-coder-0.5b-instruct, "local/tiny-*"], reason: "  writes it  "}
  - id: no-as
    question: "Hello"
    tools_called: {none: true}
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write_dataset(tmp_path, text)
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    return [p.replace(str(path), "F") for p in caught.value.problems]


def test_a_valid_file_loads_with_identities_resolved(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path, GOOD))
    assert [c.id for c in dataset.cases] == ["doc-alert-cooldown", "off-topic.poem", "no-as"]
    first, poem, plain = dataset.cases
    assert (first.user.sub, first.user.roles, first.user.domains) == (
        "eval-user",
        ["business_staff"],
        ["acme"],
    )
    assert poem.user.sub == "nina" and poem.user.roles == ["admin"]
    assert plain.user.sub == "eval-user"  # defaults.as
    assert poem.row.xfail is not None and poem.row.xfail.reason == "writes it"
    assert poem.row.judged == ["declined", "rubric"] and first.row.judged == []
    assert first.index == 1 and first.file.name == "golden.yaml"
    assert dataset.description == "tiny"


def test_without_defaults_the_fallback_identity_is_used(tmp_path: Path) -> None:
    dataset = load_dataset(
        write_dataset(tmp_path, "version: 1\nrows:\n  - {id: a, question: q, idk: true}\n")
    )
    user = dataset.cases[0].user
    assert (user.sub, user.roles, user.domains) == ("eval", [], [])


def test_unknown_keys_are_named_with_file_row_and_field(tmp_path: Path) -> None:
    text = """
    version: 1
    rows:
      - id: a
        question: q
        idk: true
        tool_calls: {all: [x]}
      - id: b
        question: q
        keywords: {all: [x], some: [y]}
    """
    assert problems(tmp_path, text) == [
        "F: row 1 (id 'a'): tool_calls: unknown key",
        "F: row 2 (id 'b'): keywords.some: unknown key",
    ]


def test_unknown_top_level_and_defaults_keys(tmp_path: Path) -> None:
    text = """
    version: 1
    owner: me
    defaults: {as: {sub: x, team: y}}
    rows: [{id: a, question: q, idk: true}]
    """
    assert sorted(problems(tmp_path, text)) == [
        "F: defaults.as.team: unknown key",
        "F: owner: unknown key",
    ]


def _xfail_row(value: str) -> str:
    return f"""
    version: 1
    rows:
      - {{id: ok, question: q, idk: true}}
      - id: x
        question: q
        idk: true
        xfail: {value}
    """


@pytest.mark.parametrize("value", ['"the model guesses"', "true", "null", "[m]"])
def test_an_unscoped_xfail_is_refused_saying_the_form(tmp_path: Path, value: str) -> None:
    # a bare reason used to hide the row for every model
    assert problems(tmp_path, _xfail_row(value)) == [
        "F: row 2 (id 'x'): xfail: give the models it is about and a reason "
        '(xfail: {models: [MODEL_ID_OR_GLOB], reason: "why it fails for them"})'
    ]


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ("{models: [m]}", "xfail.reason", "required"),
        ('{models: [m], reason: "  "}', "xfail.reason", "String should have at least 1"),
        ('{reason: "r"}', "xfail.models", "required"),
        ('{models: [], reason: "r"}', "xfail.models", "List should have at least 1 item"),
        ("{models: [m], reason: r, why: w}", "xfail.why", "unknown key"),
    ],
)
def test_a_scoped_xfail_needs_models_and_a_reason(
    tmp_path: Path, value: str, field: str, message: str
) -> None:
    (problem,) = problems(tmp_path, _xfail_row(value))
    assert problem.startswith(f"F: row 2 (id 'x'): {field}: {message}"), problem


@pytest.mark.parametrize(
    ("model", "applies"),
    [
        ("qwen2.5-coder-0.5b-instruct", True),  # exact
        ("Qwen2.5-Coder-0.5B-Instruct", True),  # case-insensitive
        ("local/tiny-7", True),  # glob
        ("qwen2.5-coder-1.5b-instruct", False),  # a sibling model is not hidden
        ("openai/gpt-4o-mini", False),  # nor a real provider
        ("qwen2.5-coder-0.5b-instruct-q4", False),  # an exact id is not a prefix
        (None, False),
    ],
)
def test_an_xfail_applies_only_to_the_models_it_names(
    tmp_path: Path, model: str | None, applies: bool
) -> None:
    poem = load_dataset(write_dataset(tmp_path, GOOD)).cases[1].row
    assert (poem.xfail_for(model) is not None) is applies


def test_duplicate_ids(tmp_path: Path) -> None:
    text = """
    version: 1
    rows:
      - {id: a, question: q, idk: true}
      - {id: b, question: q, idk: true}
      - {id: a, question: q2, idk: false}
    """
    assert problems(tmp_path, text) == ["F: row 3 (id 'a'): id: duplicate of row 1"]


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    one = write_dataset(tmp_path, "version: 1\nrows: [{id: a, question: q, idk: true}]\n", "1.yaml")
    two = write_dataset(tmp_path, "version: 1\nrows: [{id: a, question: q, idk: true}]\n", "2.yaml")
    with pytest.raises(DatasetError) as caught:
        load_datasets([one, two])
    assert str(caught.value) == f"{two}: row 1 (id 'a'): id: already used by {one} row 1"


@pytest.mark.parametrize(
    ("tools_called", "message"),
    [
        ("{}", "tools_called: give at least one of all, any, none"),
        ("{none: false}", "tools_called.none: use true (no tool call at all) or a list of tool"),
        ("{all: []}", "tools_called.all: List should have at least 1 item"),
        ("{all: search_docs}", "tools_called.all: Input should be a valid list"),
        ("{sometimes: [x]}", "tools_called.sometimes: unknown key"),
        ("{none: maybe}", "tools_called.none: Input should be a valid boolean"),
    ],
)
def test_bad_tools_called(tmp_path: Path, tools_called: str, message: str) -> None:
    text = f"""
    version: 1
    rows:
      - id: t
        question: q
        tools_called: {tools_called}
    """
    found = problems(tmp_path, text)
    assert len(found) == 1, found
    assert found[0].startswith(f"F: row 1 (id 't'): {message}")


def test_a_row_without_expectations(tmp_path: Path) -> None:
    text = """
    version: 1
    rows:
      - {id: lonely, question: q, tags: [x], xfail: {models: [m], reason: none to run}}
    """
    (problem,) = problems(tmp_path, text)
    assert problem.startswith("F: row 1 (id 'lonely'): a row needs at least one expectation")


def test_missing_and_malformed_fields(tmp_path: Path) -> None:
    text = """
    version: 2
    rows:
      - {question: q, idk: true}
      - {id: Bad_Id, question: "   ", decision: maybe}
      - {id: c, question: q, idk: "yes"}
    """
    found = problems(tmp_path, text)
    assert "F: version: Input should be 1" in found
    assert "F: row 1: id: required" in found
    assert any(p.startswith("F: row 2 (id 'Bad_Id'): id: String should match") for p in found)
    assert "F: row 2 (id 'Bad_Id'): question: String should have at least 1 character" in found
    assert any(p.startswith("F: row 2 (id 'Bad_Id'): decision: Input should be") for p in found)
    assert "F: row 3 (id 'c'): idk: Input should be a valid boolean" in found


def test_file_level_errors(tmp_path: Path) -> None:
    assert problems(tmp_path, "version: 1\nrows: [\n")[0].startswith("F: not valid YAML:")
    assert problems(tmp_path, "- a\n- b\n") == ["F: expected a mapping with 'version' and 'rows'"]
    assert problems(tmp_path, "version: 1\nrows: []\n")[0].startswith(
        "F: rows: List should have at least 1 item"
    )
    dup_key = "version: 1\nrows:\n  - {id: a, question: q, idk: true, idk: false}\n"
    assert "duplicate key 'idk'" in problems(tmp_path, dup_key)[0]
    with pytest.raises(DatasetError, match=r"nope\.yaml: no such file"):
        load_dataset(tmp_path / "nope.yaml")


def test_select_by_id_and_tag(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path, GOOD))
    assert [c.id for c in dataset.select(only=["no-as"]).cases] == ["no-as"]
    assert [c.id for c in dataset.select(tags=["doc"]).cases] == ["doc-alert-cooldown"]
    with pytest.raises(DatasetError, match="no row with id 'typo'"):
        dataset.select(only=["typo"])
    with pytest.raises(DatasetError, match="no row matches"):
        dataset.select(only=["no-as"], tags=["doc"])


def test_the_golden_dataset_if_present_is_valid() -> None:
    path = ROOT / DEFAULT_DATASET
    if not path.exists():
        pytest.skip("the golden dataset is not written yet")
    dataset = load_dataset(path)
    assert len(dataset.cases) >= 40
    marked = [case.row.xfail for case in dataset.cases if case.row.xfail is not None]
    # every marker names the model(s) it is about; none hides a row for every model (the
    # local models' markers were removed for issue 14's run of record: there may be none)
    assert all(m.models and "*" not in m.models for m in marked)


# --- dev and test, worlds (issue 42) ------------------------------------------------------

SPLIT_ROWS = """
version: 1
split: dev
rows:
  - {id: d1, question: "q1", idk: true, tags: [doc]}
  - {id: t1, question: "q2", idk: true, split: test, tags: [doc, "world:second"]}
  - {id: d2, question: "q3", idk: true, tags: [live]}
"""
UNSPLIT_ROWS = """
version: 1
rows:
  - {id: u1, question: "q4", idk: true}
"""


def test_a_rows_side_is_its_own_else_its_files_else_test(tmp_path: Path) -> None:
    dev = write_dataset(tmp_path, SPLIT_ROWS, "dev.yaml")
    plain = write_dataset(tmp_path, UNSPLIT_ROWS, "plain.yaml")
    dataset = load_datasets([dev, plain])
    assert {c.id: c.split for c in dataset.cases} == {
        "d1": "dev",
        "t1": "test",
        "d2": "dev",
        "u1": "test",  # no key anywhere: frozen
    }
    assert {c.id: c.world for c in dataset.cases} == {
        "d1": "sample",
        "t1": "second",
        "d2": "sample",
        "u1": "sample",
    }
    assert dataset.counts_by_split_and_world() == {
        ("dev", "sample"): 2,
        ("test", "sample"): 1,
        ("test", "second"): 1,
    }


def test_select_by_split_and_world(tmp_path: Path) -> None:
    dev = write_dataset(tmp_path, SPLIT_ROWS, "dev.yaml")
    plain = write_dataset(tmp_path, UNSPLIT_ROWS, "plain.yaml")
    dataset = load_datasets([dev, plain])
    chosen = dataset.select(split="dev")
    assert [c.id for c in chosen.cases] == ["d1", "d2"]
    assert (chosen.split, chosen.rows_in_files) == ("dev", 4)
    assert chosen.counts_by_file() == {dev: 2, plain: 0}
    assert [c.id for c in dataset.select(split="test").cases] == ["t1", "u1"]
    assert [c.id for c in dataset.select(split="test", worlds=["second"]).cases] == ["t1"]
    assert [c.id for c in dataset.select(worlds=["sample"]).cases] == ["d1", "d2", "u1"]
    # a selection of a selection keeps the narrower record
    assert dataset.select(split="dev").select(only=["d1"]).split == "dev"
    with pytest.raises(DatasetError, match=r"--only: row 't1' is on the test split, not dev"):
        dataset.select(only=["t1"], split="dev")
    with pytest.raises(DatasetError, match=r"--world: no row in world 'mars'"):
        dataset.select(worlds=["mars"])
    with pytest.raises(DatasetError, match=r"no row matches the selection \(--split dev"):
        load_datasets([plain]).select(split="dev")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("split: train", "split: Input should be 'dev' or 'test'"),
        ('tags: ["world:a", "world:b"]', "tags: a row is in one world, not 2 (a, b)"),
        ('tags: ["world:Big World"]', "tags: world:Big World: a world name is like"),
    ],
)
def test_bad_split_or_world(tmp_path: Path, row: str, message: str) -> None:
    text = f"""
    version: 1
    rows:
      - id: r
        question: q
        idk: true
        {row}
    """
    found = problems(tmp_path, text)
    assert len(found) == 1 and found[0].startswith(f"F: row 1 (id 'r'): {message}"), found
